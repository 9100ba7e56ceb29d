//===- Jinja.cpp - The Jinja subset of chat templates ----------------------===//
//
// A lexer that applies Jinja2's whitespace rules (trim_blocks, lstrip_blocks, -
// and +), a recursive-descent parser with Jinja2's operator precedence, and a
// tree-walking evaluator with Python's value semantics. See Jinja.h.
//
//===----------------------------------------------------------------------===//
#include "compiler/importers/hf/Jinja.h"

#include "formats/whitespace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <sstream>

namespace kiln::jinja {

const Value* Value::get(const std::string& key) const {
  if (!dict) return nullptr;
  for (const auto& kv : *dict)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Value::set(const std::string& key, Value value) {
  for (auto& kv : *dict)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  dict->emplace_back(key, std::move(value));
}

namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("line " + std::to_string(line) + ": " + what);
}

// ------------------------------------------------------------------ values

const char* kindName(const Value& v) {
  switch (v.kind) {
  case Value::Undefined: return "undefined";
  case Value::None: return "none";
  case Value::Bool: return "bool";
  case Value::Int: return "int";
  case Value::Float: return "float";
  case Value::String: return "string";
  case Value::ListKind: return "list";
  case Value::DictKind: return "dict";
  case Value::Namespace: return "namespace";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
  case Value::Undefined:
  case Value::None: return false;
  case Value::Bool: return v.b;
  case Value::Int: return v.i != 0;
  case Value::Float: return v.f != 0;
  case Value::String: return !v.s.empty();
  case Value::ListKind: return !v.list->empty();
  case Value::DictKind: return !v.dict->empty();
  case Value::Namespace: return true;
  }
  return false;
}

std::string pyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {  // the shortest text that reads back the same
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string repr(const Value& v);

// Python's str() of a value, as Jinja prints it.
std::string str(const Value& v) {
  switch (v.kind) {
  case Value::Undefined: return "";
  case Value::None: return "None";
  case Value::Bool: return v.b ? "True" : "False";
  case Value::Int: return std::to_string(v.i);
  case Value::Float: return pyFloat(v.f);
  case Value::String: return v.s;
  default: return repr(v);
  }
}

std::string repr(const Value& v) {
  if (v.kind == Value::String) {
    bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
    std::string out(1, dq ? '"' : '\'');
    for (char c : v.s) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c == '\'' && !dq) out += "\\'";
      else out += c;
    }
    return out + (dq ? '"' : '\'');
  }
  if (v.kind == Value::ListKind) {
    std::string out = "[";
    for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
    return out + "]";
  }
  if (v.kind == Value::DictKind || v.kind == Value::Namespace) {
    std::string out = v.kind == Value::Namespace ? "<Namespace {" : "{";
    bool first = true;
    for (const auto& kv : *v.dict) {
      out += (first ? "" : ", ") + repr(Value::string(kv.first)) + ": " + repr(kv.second);
      first = false;
    }
    return out + (v.kind == Value::Namespace ? "}>" : "}");
  }
  return str(v);
}

bool equal(const Value& a, const Value& b) {
  bool an = a.kind == Value::Int || a.kind == Value::Float || a.kind == Value::Bool;
  bool bn = b.kind == Value::Int || b.kind == Value::Float || b.kind == Value::Bool;
  if (an && bn) {
    double x = a.kind == Value::Float ? a.f : a.kind == Value::Int ? double(a.i) : double(a.b);
    double y = b.kind == Value::Float ? b.f : b.kind == Value::Int ? double(b.i) : double(b.b);
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
  case Value::Undefined:
  case Value::None: return true;
  case Value::String: return a.s == b.s;
  case Value::ListKind:
    if (a.list->size() != b.list->size()) return false;
    for (size_t k = 0; k < a.list->size(); ++k)
      if (!equal((*a.list)[k], (*b.list)[k])) return false;
    return true;
  case Value::DictKind:
    if (a.dict->size() != b.dict->size()) return false;
    for (const auto& kv : *a.dict) {
      const Value* o = b.get(kv.first);
      if (!o || !equal(kv.second, *o)) return false;
    }
    return true;
  default: return a.dict == b.dict;
  }
}

bool isNumber(const Value& v) { return v.kind == Value::Int || v.kind == Value::Float || v.kind == Value::Bool; }
double num(const Value& v) { return v.kind == Value::Float ? v.f : v.kind == Value::Int ? double(v.i) : double(v.b); }
int64_t intOf(const Value& v) { return v.kind == Value::Int ? v.i : v.kind == Value::Bool ? v.b : int64_t(v.f); }

int compare(const Value& a, const Value& b, int line) {
  if (isNumber(a) && isNumber(b)) {
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Value::String && b.kind == Value::String) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.kind == Value::ListKind && b.kind == Value::ListKind) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      int c = compare((*a.list)[k], (*b.list)[k], line);
      if (c) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(line, std::string("cannot compare ") + kindName(a) + " and " + kindName(b));
}

// The items a for loop, selectattr or join iterates: a dict gives its keys, a
// string its characters (UTF-8 sequences), undefined nothing.
List items(const Value& v, int line) {
  switch (v.kind) {
  case Value::ListKind: return *v.list;
  case Value::DictKind: {
    List out;
    for (const auto& kv : *v.dict) out.push_back(Value::string(kv.first));
    return out;
  }
  case Value::String: {
    List out;
    for (size_t k = 0; k < v.s.size();) {
      unsigned char c = static_cast<unsigned char>(v.s[k]);
      size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      out.push_back(Value::string(v.s.substr(k, len)));
      k += len;
    }
    return out;
  }
  case Value::Undefined: return {};
  default: fail(line, std::string("a ") + kindName(v) + " is not iterable");
  }
}

size_t utf8Length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  if (!chars) return stripSpace(s, left, right);
  auto drop = [&](char c) { return chars->find(c) != std::string::npos; };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = true;
    }
  }
  return out;
}
std::string replaceAll(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out += s.substr(pos, k - pos) + to;
    pos = k + from.size();
  }
  return out + s.substr(pos);
}

List split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->kind == Value::None) {  // runs of whitespace, no empty items
    size_t k = 0;
    while (k < s.size()) {
      while (k < s.size() && spaceLength(s, k) > 0) k += spaceLength(s, k);
      if (k >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.push_back(Value::string(s.substr(k)));  // the rest as it is, as Python's
        return out;
      }
      size_t e = k;
      while (e < s.size() && spaceLength(s, e) == 0) ++e;
      out.push_back(Value::string(s.substr(k, e - k)));
      k = e;
    }
    return out;
  }
  const std::string& d = sep->s;
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    size_t k = s.find(d, pos);
    if (k == std::string::npos) break;
    out.push_back(Value::string(s.substr(pos, k - pos)));
    pos = k + d.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return out;
}

void jsonString(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
  }
  out += '"';
}

void json(std::string& out, const Value& v, int indent, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
  case Value::Undefined:
  case Value::None: out += "null"; return;
  case Value::Bool: out += v.b ? "true" : "false"; return;
  case Value::Int: out += std::to_string(v.i); return;
  case Value::Float: out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : pyFloat(v.f); return;
  case Value::String: jsonString(out, v.s); return;
  case Value::ListKind: {
    if (v.list->empty()) { out += "[]"; return; }
    out += '[';
    for (size_t k = 0; k < v.list->size(); ++k) {
      if (k) out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(depth + 1);
      json(out, (*v.list)[k], indent, depth + 1);
    }
    if (indent >= 0) newline(depth);
    out += ']';
    return;
  }
  case Value::DictKind:
  case Value::Namespace: {
    if (v.dict->empty()) { out += "{}"; return; }
    out += '{';
    bool first = true;
    for (const auto& kv : *v.dict) {
      if (!first) out += indent >= 0 ? "," : ", ";
      first = false;
      if (indent >= 0) newline(depth + 1);
      jsonString(out, kv.first);
      out += ": ";
      json(out, kv.second, indent, depth + 1);
    }
    if (indent >= 0) newline(depth);
    out += '}';
    return;
  }
  }
}

// ------------------------------------------------------------------ lexing

struct Token {
  enum Kind { Name, Str, Int, Float, Op, End } kind;
  std::string text;
  int line;
};

std::vector<Token> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t k = 0;
  while (k < s.size()) {
    char c = s[k];
    if (isSpace(c)) {
      if (c == '\n') ++line;
      ++k;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Token::Name, s.substr(k, e - k), line});
      k = e;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      bool real = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        real = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      std::string t = s.substr(k, e - k);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      out.push_back({real ? Token::Float : Token::Int, t, line});
      k = e;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string t;
      size_t e = k + 1;
      for (;; ++e) {
        if (e >= s.size()) fail(line, "unterminated string");
        if (s[e] == c) break;
        if (s[e] == '\n') ++line;
        if (s[e] == '\\' && e + 1 < s.size()) {
          char n = s[++e];
          switch (n) {
          case 'n': t += '\n'; break;
          case 't': t += '\t'; break;
          case 'r': t += '\r'; break;
          case '\\': t += '\\'; break;
          case '\'': t += '\''; break;
          case '"': t += '"'; break;
          case '\n': break;
          case 'u':
          case 'x': {
            size_t len = n == 'u' ? 4 : 2;
            if (e + len >= s.size()) fail(line, "bad escape in a string");
            uint32_t cp = static_cast<uint32_t>(std::stoul(s.substr(e + 1, len), nullptr, 16));
            e += len;
            if (cp < 0x80) {
              t += static_cast<char>(cp);
            } else if (cp < 0x800) {
              t += static_cast<char>(0xC0 | (cp >> 6));
              t += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              t += static_cast<char>(0xE0 | (cp >> 12));
              t += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              t += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: t += '\\'; t += n;
          }
          continue;
        }
        t += s[e];
      }
      out.push_back({Token::Str, t, line});
      k = e + 1;
      continue;
    }
    static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "(",
                                ")",  "[",  "]",  "{",  "}",  ",", ":", ".", "|", "="};
    bool found = false;
    for (const char* op : ops) {
      size_t len = std::strlen(op);
      if (s.compare(k, len, op) == 0) {
        out.push_back({Token::Op, op, line});
        k += len;
        found = true;
        break;
      }
    }
    if (!found) fail(line, std::string("unexpected character '") + c + "'");
  }
  out.push_back({Token::End, "", line});
  return out;
}

struct Chunk {
  enum Kind { Text, Output, Block } kind;
  std::string text;  // Text: the text; Output/Block: the tag's contents
  int line;
};

// Splits the template into text and tags, applying Jinja2's whitespace control with
// trim_blocks and lstrip_blocks (its lexer's rules; keep_trailing_newline off).
std::vector<Chunk> lex(std::string src) {
  for (size_t k; (k = src.find("\r\n")) != std::string::npos;) src.erase(k, 1);
  if (!src.empty() && src.back() == '\n') src.pop_back();
  std::vector<Chunk> chunks;
  size_t pos = 0;
  int line = 1;
  bool lineStarting = true;  // the previous tag ended with a newline (or none yet)
  bool stripNext = false;    // the previous tag ended with '-'
  auto countLines = [](const std::string& s, size_t b, size_t e) {
    return static_cast<int>(std::count(s.begin() + static_cast<long>(b), s.begin() + static_cast<long>(e), '\n'));
  };
  while (pos <= src.size()) {
    size_t k = pos;
    for (;;) {
      k = src.find('{', k);
      if (k == std::string::npos || k + 1 >= src.size()) { k = std::string::npos; break; }
      char n = src[k + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++k;
    }
    std::string text = src.substr(pos, k == std::string::npos ? std::string::npos : k - pos);
    if (stripNext) {
      size_t b = 0;
      while (b < text.size() && isSpace(text[b])) ++b;
      text.erase(0, b);
    }
    if (k == std::string::npos) {
      if (!text.empty()) chunks.push_back({Chunk::Text, text, line});
      break;
    }
    char type = src[k + 1];
    char mod = k + 2 < src.size() ? src[k + 2] : 0;
    if (mod == '-') {
      size_t e = text.size();
      while (e > 0 && isSpace(text[e - 1])) --e;
      text.erase(e);
    } else if (mod != '+' && type != '{') {  // lstrip_blocks
      size_t l = text.rfind('\n');
      size_t start = l == std::string::npos ? 0 : l + 1;
      if ((l != std::string::npos || lineStarting) && start < text.size() &&
          std::all_of(text.begin() + static_cast<long>(start), text.end(), isSpace))
        text.erase(start);
    }
    if (!text.empty()) chunks.push_back({Chunk::Text, text, line});
    line += countLines(src, pos, k);
    size_t body = k + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    // The closing delimiter, outside of string literals.
    const char* close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t e = body;
    if (type == '#') {
      e = src.find("#}", body);
    } else {
      char quote = 0;
      for (; e + 1 < src.size(); ++e) {
        if (quote) {
          if (src[e] == '\\') ++e;
          else if (src[e] == quote) quote = 0;
        } else if (src[e] == '\'' || src[e] == '"') {
          quote = src[e];
        } else if (src[e] == close[0] && src[e + 1] == close[1]) {
          break;
        }
      }
      if (e + 1 >= src.size()) e = std::string::npos;
    }
    if (e == std::string::npos) fail(line, std::string("unclosed '{") + type + "'");
    size_t inner_end = e;
    bool rstrip = false, keep = false;
    if (inner_end > body && src[inner_end - 1] == '-') { rstrip = true; --inner_end; }
    else if (inner_end > body && src[inner_end - 1] == '+' && type != '{') { keep = true; --inner_end; }
    std::string inner = src.substr(body, inner_end - body);
    if (type != '#') chunks.push_back({type == '{' ? Chunk::Output : Chunk::Block, inner, line});
    line += countLines(src, k, e + 2);
    pos = e + 2;
    stripNext = rstrip;
    lineStarting = false;
    if (rstrip) {
      size_t b = pos;
      while (b < src.size() && isSpace(src[b])) ++b;
      lineStarting = b > pos && src[b - 1] == '\n';
    } else if (type != '{' && !keep && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos;
      ++line;
      lineStarting = true;
    }
  }
  return chunks;
}

}  // namespace

// ------------------------------------------------------------------ syntax tree

struct Template::Node {
  enum Kind {
    // expressions
    Literal, Name, GetAttr, GetItem, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary, Cond, ListLit,
    DictLit,
    // statements
    Body, Text, Output, If, For, Set, SetBlock, Break, Continue
  } kind;
  int line = 0;
  Value value;                 // Literal
  std::string name;            // Name, GetAttr, Filter/Test name, Binary op, Set target, For targets (comma-joined)
  std::string attr;            // Set: the namespace attribute
  std::vector<std::unique_ptr<Node>> kids;  // operands / statements
  std::vector<std::string> kwnames;         // Call/Filter/Test: names of the trailing keyword arguments
  bool negated = false;        // Test: "is not"
  std::unique_ptr<Node> a, b, c;  // If: cond, then, else; For: iter, body, else; Cond: value, test, otherwise
  std::unique_ptr<Node> filter;   // For: the loop's "if"

  Node(Kind k, int l) : kind(k), line(l) {}
};

namespace {
using NodeP = std::unique_ptr<Template::Node>;
using N = Template::Node;

NodeP node(N::Kind k, int line) { return std::make_unique<N>(k, line); }

class ExprParser {
public:
  explicit ExprParser(std::vector<Token> t) : t_(std::move(t)) {}
  const Token& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool isOp(const char* op, size_t ahead = 0) const { return peek(ahead).kind == Token::Op && peek(ahead).text == op; }
  bool isName(const char* n, size_t ahead = 0) const { return peek(ahead).kind == Token::Name && peek(ahead).text == n; }
  Token next() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool atEnd() const { return peek().kind == Token::End; }
  void expectOp(const char* op) {
    if (!isOp(op)) fail(peek().line, std::string("expected '") + op + "', found '" + peek().text + "'");
    ++p_;
  }
  std::string expectName() {
    if (peek().kind != Token::Name) fail(peek().line, "expected a name, found '" + peek().text + "'");
    return next().text;
  }
  void expectEnd() {
    if (!atEnd()) fail(peek().line, "unexpected '" + peek().text + "'");
  }

  // expr := or ["if" or ["else" expr]]
  NodeP expr(bool withCond = true) {
    NodeP v = orExpr();
    if (withCond && isName("if")) {
      int line = next().line;
      auto n = node(N::Cond, line);
      n->b = orExpr();
      n->a = std::move(v);
      if (isName("else")) {
        next();
        n->c = expr();
      }
      return n;
    }
    return v;
  }
  NodeP orExpr() {
    NodeP l = andExpr();
    while (isName("or")) {
      auto n = node(N::Or, next().line);
      n->a = std::move(l);
      n->b = andExpr();
      l = std::move(n);
    }
    return l;
  }
  NodeP andExpr() {
    NodeP l = notExpr();
    while (isName("and")) {
      auto n = node(N::And, next().line);
      n->a = std::move(l);
      n->b = notExpr();
      l = std::move(n);
    }
    return l;
  }
  NodeP notExpr() {
    if (isName("not")) {
      auto n = node(N::Not, next().line);
      n->a = notExpr();
      return n;
    }
    return compare();
  }
  NodeP compare() {
    NodeP l = math1();
    for (;;) {
      std::string op;
      if (isOp("==") || isOp("!=") || isOp("<") || isOp(">") || isOp("<=") || isOp(">=")) op = peek().text;
      else if (isName("in")) op = "in";
      else if (isName("not") && isName("in", 1)) op = "not in";
      else break;
      int line = next().line;
      if (op == "not in") next();
      auto n = node(N::Binary, line);
      n->name = op;
      n->a = std::move(l);
      n->b = math1();
      l = std::move(n);
    }
    return l;
  }
  NodeP binary(NodeP l, std::string op, NodeP r, int line) {
    auto n = node(N::Binary, line);
    n->name = std::move(op);
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }
  NodeP math1() {
    NodeP l = concat();
    while (isOp("+") || isOp("-")) {
      Token t = next();
      l = binary(std::move(l), t.text, concat(), t.line);
    }
    return l;
  }
  NodeP concat() {
    NodeP l = math2();
    while (isOp("~")) {
      Token t = next();
      l = binary(std::move(l), "~", math2(), t.line);
    }
    return l;
  }
  NodeP math2() {
    NodeP l = pow();
    while (isOp("*") || isOp("/") || isOp("//") || isOp("%")) {
      Token t = next();
      l = binary(std::move(l), t.text, pow(), t.line);
    }
    return l;
  }
  NodeP pow() {
    NodeP l = unary(true);
    while (isOp("**")) {
      Token t = next();
      l = binary(std::move(l), "**", unary(true), t.line);
    }
    return l;
  }
  NodeP unary(bool withFilter) {
    NodeP n;
    if (isOp("-") || isOp("+")) {
      Token t = next();
      n = node(t.text == "-" ? N::Neg : N::Pos, t.line);
      n->a = unary(false);
    } else {
      n = postfix(primary());
    }
    return withFilter ? filters(std::move(n)) : std::move(n);
  }
  NodeP primary() {
    Token t = next();
    switch (t.kind) {
    case Token::Str: {
      auto n = node(N::Literal, t.line);
      std::string s = t.text;
      while (peek().kind == Token::Str) s += next().text;  // adjacent literals concatenate
      n->value = Value::string(s);
      return n;
    }
    case Token::Int: {
      auto n = node(N::Literal, t.line);
      n->value = Value::integer(std::stoll(t.text));
      return n;
    }
    case Token::Float: {
      auto n = node(N::Literal, t.line);
      n->value = Value::real(std::stod(t.text));
      return n;
    }
    case Token::Name: {
      auto n = node(N::Literal, t.line);
      if (t.text == "true" || t.text == "True") n->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") n->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") n->value = Value::none();
      else {
        n->kind = N::Name;
        n->name = t.text;
      }
      return n;
    }
    case Token::Op:
      if (t.text == "(") {
        if (isOp(")")) {
          next();
          auto n = node(N::ListLit, t.line);
          return n;
        }
        NodeP e = expr();
        if (isOp(",")) {  // a tuple: a list here
          auto n = node(N::ListLit, t.line);
          n->kids.push_back(std::move(e));
          while (isOp(",")) {
            next();
            if (isOp(")")) break;
            n->kids.push_back(expr());
          }
          e = std::move(n);
        }
        expectOp(")");
        return e;
      }
      if (t.text == "[") {
        auto n = node(N::ListLit, t.line);
        while (!isOp("]")) {
          n->kids.push_back(expr());
          if (!isOp(",")) break;
          next();
        }
        expectOp("]");
        return n;
      }
      if (t.text == "{") {
        auto n = node(N::DictLit, t.line);
        while (!isOp("}")) {
          n->kids.push_back(expr());
          expectOp(":");
          n->kids.push_back(expr());
          if (!isOp(",")) break;
          next();
        }
        expectOp("}");
        return n;
      }
      break;
    default: break;
    }
    fail(t.line, t.kind == Token::End ? "unexpected end of expression" : "unexpected '" + t.text + "'");
  }
  // Positional then keyword arguments, after '('.
  void args(N* n) {
    while (!isOp(")")) {
      if (peek().kind == Token::Name && isOp("=", 1)) {
        n->kwnames.push_back(next().text);
        next();
      } else if (!n->kwnames.empty()) {
        fail(peek().line, "a positional argument after keyword arguments");
      }
      n->kids.push_back(expr());
      if (!isOp(",")) break;
      next();
    }
    expectOp(")");
  }
  NodeP postfix(NodeP n) {
    for (;;) {
      if (isOp(".")) {
        int line = next().line;
        auto g = node(N::GetAttr, line);
        if (peek().kind == Token::Int) g->name = next().text;
        else g->name = expectName();
        g->a = std::move(n);
        n = std::move(g);
      } else if (isOp("[")) {
        int line = next().line;
        NodeP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!isOp(":") && !isOp("]")) parts[k] = expr();
          if (k < 2 && isOp(":")) {
            next();
            slice = true;
          } else {
            break;
          }
        }
        expectOp("]");
        auto g = node(slice ? N::Slice : N::GetItem, line);
        g->a = std::move(n);
        if (slice) {
          for (auto& p : parts) g->kids.push_back(std::move(p));
        } else {
          if (!parts[0]) fail(line, "empty subscript");
          g->b = std::move(parts[0]);
        }
        n = std::move(g);
      } else if (isOp("(")) {
        int line = next().line;
        auto c = node(N::Call, line);
        c->a = std::move(n);
        args(c.get());
        n = std::move(c);
      } else {
        return n;
      }
    }
  }
  NodeP filters(NodeP n) {
    for (;;) {
      if (isOp("|")) {
        int line = next().line;
        auto f = node(N::Filter, line);
        f->name = expectName();
        while (isOp(".")) {
          next();
          f->name += "." + expectName();
        }
        f->a = std::move(n);
        if (isOp("(")) {
          next();
          args(f.get());
        }
        n = std::move(f);
      } else if (isName("is")) {
        int line = next().line;
        auto t = node(N::Test, line);
        if (isName("not")) {
          next();
          t->negated = true;
        }
        t->name = expectName();
        t->a = std::move(n);
        if (isOp("(")) {
          next();
          args(t.get());
        } else if (peek().kind == Token::Str || peek().kind == Token::Int || peek().kind == Token::Float ||
                   (peek().kind == Token::Name && !isName("and") && !isName("or") && !isName("else") &&
                    !isName("if") && !isName("is") && !isName("in") && !isName("not"))) {
          t->kids.push_back(postfix(primary()));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

private:
  std::vector<Token> t_;
  size_t p_ = 0;
};

// Statements: the chunks as a tree.
class StmtParser {
public:
  explicit StmtParser(std::vector<Chunk> c) : c_(std::move(c)) {}

  NodeP parse() {
    std::string end;
    NodeP body = block({}, &end);
    if (!end.empty()) fail(line_, "unexpected '{% " + end + " %}'");
    return body;
  }

private:
  // Statements up to one of `stops` (a block tag whose first word is in it); the
  // word found is written to *stop and the tag's remaining tokens to rest_.
  NodeP block(const std::vector<std::string>& stops, std::string* stop, int openLine = 0) {
    auto body = node(N::Body, k_ < c_.size() ? c_[k_].line : line_);
    while (k_ < c_.size()) {
      const Chunk& ch = c_[k_++];
      line_ = ch.line;
      if (ch.kind == Chunk::Text) {
        auto t = node(N::Text, ch.line);
        t->value = Value::string(ch.text);
        body->kids.push_back(std::move(t));
        continue;
      }
      ExprParser p(tokenize(ch.text, ch.line));
      if (ch.kind == Chunk::Output) {
        auto o = node(N::Output, ch.line);
        o->a = p.expr();
        p.expectEnd();
        body->kids.push_back(std::move(o));
        continue;
      }
      std::string word = p.expectName();
      if (std::find(stops.begin(), stops.end(), word) != stops.end()) {
        *stop = word;
        rest_ = std::make_unique<ExprParser>(std::move(p));
        return body;
      }
      body->kids.push_back(statement(word, p, ch.line));
    }
    if (!stops.empty()) fail(openLine, "this block has no '{% " + stops.back() + " %}'");
    stop->clear();
    return body;
  }

  NodeP statement(const std::string& word, ExprParser& p, int line) {
    if (word == "if") {
      auto n = node(N::If, line);
      n->a = p.expr();
      p.expectEnd();
      std::string stop;
      n->b = block({"elif", "else", "endif"}, &stop, line);
      if (stop == "elif") {
        n->c = node(N::Body, line_);
        n->c->kids.push_back(statement("if", *rest_, line_));  // the elif chain nests; it ends at the same endif
        return n;
      }
      if (stop == "else") {
        rest_->expectEnd();
        n->c = block({"endif"}, &stop, line);
      }
      rest_->expectEnd();
      return n;
    }
    if (word == "for") {
      auto n = node(N::For, line);
      n->name = p.expectName();
      while (p.isOp(",")) {
        p.next();
        n->name += "," + p.expectName();
      }
      if (!p.isName("in")) fail(line, "expected 'in' in a for loop");
      p.next();
      n->a = p.expr(false);
      if (p.isName("if")) {
        p.next();
        n->filter = p.expr(false);
      }
      if (p.isName("recursive")) fail(line, "recursive loops are not supported");
      p.expectEnd();
      std::string stop;
      n->b = block({"else", "endfor"}, &stop, line);
      if (stop == "else") {
        rest_->expectEnd();
        n->c = block({"endfor"}, &stop, line);
      }
      rest_->expectEnd();
      return n;
    }
    if (word == "set") {
      std::string target = p.expectName();
      std::string attr;
      if (p.isOp(".")) {
        p.next();
        attr = p.expectName();
      }
      if (p.atEnd()) {  // {% set x %}...{% endset %}
        if (!attr.empty()) fail(line, "a block set of a namespace attribute is not supported");
        auto n = node(N::SetBlock, line);
        n->name = target;
        std::string stop;
        n->a = block({"endset"}, &stop, line);
        rest_->expectEnd();
        return n;
      }
      if (p.isOp(",")) fail(line, "unpacking in set is not supported");
      p.expectOp("=");
      auto n = node(N::Set, line);
      n->name = target;
      n->attr = attr;
      n->a = p.expr();
      p.expectEnd();
      return n;
    }
    if (word == "generation") {  // transformers' AssistantTracker: renders its body
      p.expectEnd();
      std::string stop;
      NodeP body = block({"endgeneration"}, &stop, line);
      rest_->expectEnd();
      return body;
    }
    if (word == "break" || word == "continue") {
      p.expectEnd();
      return node(word == "break" ? N::Break : N::Continue, line);
    }
    fail(line, "'{% " + word + " %}' is not supported in chat templates");
  }

  std::vector<Chunk> c_;
  size_t k_ = 0;
  int line_ = 1;
  std::unique_ptr<ExprParser> rest_;
};

// ------------------------------------------------------------------ evaluation

struct LoopSignal {
  bool brk;
};

class Evaluator {
public:
  explicit Evaluator(const Value& context) {
    scopes_.emplace_back();
    if (context.dict)
      for (const auto& kv : *context.dict) scopes_.back()[kv.first] = kv.second;
  }

  void run(const N& n, std::string& out) {
    switch (n.kind) {
    case N::Body:
      for (const auto& k : n.kids) run(*k, out);
      return;
    case N::Text: out += n.value.s; return;
    case N::Output: out += str(eval(*n.a)); return;
    case N::If:
      if (truthy(eval(*n.a))) run(*n.b, out);
      else if (n.c) run(*n.c, out);
      return;
    case N::For: return runFor(n, out);
    case N::Set: {
      Value v = eval(*n.a);
      if (n.attr.empty()) {
        scopes_.back()[n.name] = std::move(v);
        return;
      }
      Value ns = lookup(n.name, n.line);
      if (ns.kind != Value::Namespace) fail(n.line, "'" + n.name + "' is not a namespace: its attributes cannot be set");
      ns.set(n.attr, std::move(v));
      return;
    }
    case N::SetBlock: {
      std::string body;
      run(*n.a, body);
      scopes_.back()[n.name] = Value::string(body);
      return;
    }
    case N::Break: throw LoopSignal{true};
    case N::Continue: throw LoopSignal{false};
    default: fail(n.line, "internal: not a statement");
    }
  }

private:
  void runFor(const N& n, std::string& out) {
    List all = items(eval(*n.a), n.line);
    std::vector<std::string> names;
    {
      std::stringstream ss(n.name);
      for (std::string x; std::getline(ss, x, ',');) names.push_back(x);
    }
    auto bind = [&](std::map<std::string, Value>& scope, const Value& item) {
      if (names.size() == 1) {
        scope[names[0]] = item;
        return;
      }
      List parts = items(item, n.line);
      if (parts.size() != names.size()) fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values");
      for (size_t k = 0; k < names.size(); ++k) scope[names[k]] = parts[k];
    };
    if (n.filter) {  // the loop's "if" filters before loop.length is known
      List kept;
      for (const Value& item : all) {
        scopes_.emplace_back();
        bind(scopes_.back(), item);
        bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      all = std::move(kept);
    }
    if (all.empty()) {
      if (n.c) run(*n.c, out);
      return;
    }
    const int64_t len = static_cast<int64_t>(all.size());
    for (int64_t k = 0; k < len; ++k) {
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      bind(scope, all[static_cast<size_t>(k)]);
      Value loop = Value::makeDict({{"index", Value::integer(k + 1)},
                                    {"index0", Value::integer(k)},
                                    {"revindex", Value::integer(len - k)},
                                    {"revindex0", Value::integer(len - k - 1)},
                                    {"first", Value::boolean(k == 0)},
                                    {"last", Value::boolean(k == len - 1)},
                                    {"length", Value::integer(len)},
                                    {"previtem", k > 0 ? all[static_cast<size_t>(k - 1)] : Value()},
                                    {"nextitem", k + 1 < len ? all[static_cast<size_t>(k + 1)] : Value()}});
      scope["loop"] = loop;
      bool stop = false;
      try {
        run(*n.b, out);
      } catch (const LoopSignal& s) {
        stop = s.brk;
      }
      scopes_.pop_back();
      if (stop) break;
    }
  }

  Value lookup(const std::string& name, int line) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    (void)line;
    // The globals a template may test with "is defined" before calling them.
    static const char* builtins[] = {"raise_exception", "strftime_now", "namespace", "range", "dict"};
    for (const char* b : builtins)
      if (name == b) return Value::string(std::string("<built-in function ") + b + ">");
    return Value();
  }

  static Value attribute(const Value& obj, const std::string& key, int line) {
    if (obj.kind == Value::Undefined) fail(line, "'" + key + "' of an undefined value");
    if (obj.kind == Value::DictKind || obj.kind == Value::Namespace) {
      const Value* v = obj.get(key);
      return v ? *v : Value();
    }
    if (obj.kind == Value::ListKind && !key.empty() && std::isdigit(static_cast<unsigned char>(key[0])))
      return item(obj, Value::integer(std::stoll(key)), line);
    return Value();  // a method name: resolved by Call
  }

  static Value item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::Undefined) fail(line, "subscript of an undefined value");
    if ((obj.kind == Value::ListKind || obj.kind == Value::String) && (key.kind == Value::Int || key.kind == Value::Bool)) {
      List all = obj.kind == Value::ListKind ? *obj.list : items(obj, line);
      int64_t k = intOf(key), size = static_cast<int64_t>(all.size());
      if (k < 0) k += size;
      if (k < 0 || k >= size) return Value();
      return all[static_cast<size_t>(k)];
    }
    if ((obj.kind == Value::DictKind || obj.kind == Value::Namespace) && key.kind == Value::String) {
      const Value* v = obj.get(key.s);
      return v ? *v : Value();
    }
    return Value();
  }

  Value eval(const N& n) {
    switch (n.kind) {
    case N::Literal: return n.value;
    case N::Name: return lookup(n.name, n.line);
    case N::GetAttr: return attribute(eval(*n.a), n.name, n.line);
    case N::GetItem: {
      Value obj = eval(*n.a);
      return item(obj, eval(*n.b), n.line);
    }
    case N::Slice: return slice(n);
    case N::Call: return call(n);
    case N::Filter: return filter(n);
    case N::Test: {
      bool r = test(n);
      return Value::boolean(n.negated ? !r : r);
    }
    case N::Neg:
    case N::Pos: {
      Value v = eval(*n.a);
      if (!isNumber(v)) fail(n.line, std::string("bad operand for unary ") + (n.kind == N::Neg ? "-" : "+") + ": " + kindName(v));
      if (n.kind == N::Pos) return v;
      return v.kind == Value::Float ? Value::real(-v.f) : Value::integer(-intOf(v));
    }
    case N::Not: return Value::boolean(!truthy(eval(*n.a)));
    case N::And: {
      Value l = eval(*n.a);
      return truthy(l) ? eval(*n.b) : l;
    }
    case N::Or: {
      Value l = eval(*n.a);
      return truthy(l) ? l : eval(*n.b);
    }
    case N::Cond:
      if (truthy(eval(*n.b))) return eval(*n.a);
      return n.c ? eval(*n.c) : Value();
    case N::Binary: return binaryOp(n);
    case N::ListLit: {
      List l;
      for (const auto& k : n.kids) l.push_back(eval(*k));
      return Value::makeList(std::move(l));
    }
    case N::DictLit: {
      Value d = Value::makeDict();
      for (size_t k = 0; k + 1 < n.kids.size(); k += 2) d.set(str(eval(*n.kids[k])), eval(*n.kids[k + 1]));
      return d;
    }
    default: fail(n.line, "internal: not an expression");
    }
  }

  Value slice(const N& n) {
    Value obj = eval(*n.a);
    if (obj.kind != Value::ListKind && obj.kind != Value::String)
      fail(n.line, std::string("cannot slice a ") + kindName(obj));
    List all = obj.kind == Value::ListKind ? *obj.list : items(obj, n.line);
    int64_t size = static_cast<int64_t>(all.size());
    auto part = [&](size_t k) -> std::optional<int64_t> {
      if (!n.kids[k]) return std::nullopt;
      Value v = eval(*n.kids[k]);
      if (v.kind == Value::None) return std::nullopt;
      if (v.kind != Value::Int) fail(n.line, "slice indices must be integers");
      return v.i;
    };
    int64_t step = part(2).value_or(1);
    if (step == 0) fail(n.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + size : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, size);
      return std::clamp<int64_t>(x, -1, size - 1);
    };
    int64_t start = clamp(part(0), step > 0 ? 0 : size - 1), stop = clamp(part(1), step > 0 ? size : -1);
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(all[static_cast<size_t>(k)]);
    if (obj.kind == Value::ListKind) return Value::makeList(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.s;
    return Value::string(s);
  }

  Value binaryOp(const N& n) {
    const std::string& op = n.name;
    Value l = eval(*n.a), r = eval(*n.b);
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "<") return Value::boolean(compare(l, r, n.line) < 0);
    if (op == ">") return Value::boolean(compare(l, r, n.line) > 0);
    if (op == "<=") return Value::boolean(compare(l, r, n.line) <= 0);
    if (op == ">=") return Value::boolean(compare(l, r, n.line) >= 0);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.kind == Value::String) {
        if (l.kind != Value::String) fail(n.line, "'in <string>' requires a string on the left");
        found = r.s.find(l.s) != std::string::npos;
      } else if (r.kind == Value::ListKind) {
        for (const Value& v : *r.list) found = found || equal(v, l);
      } else if (r.kind == Value::DictKind || r.kind == Value::Namespace) {
        found = l.kind == Value::String && r.get(l.s);
      } else {
        fail(n.line, std::string("'in' of a ") + kindName(r));
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "~") return Value::string(str(l) + str(r));
    if (l.kind == Value::Undefined || r.kind == Value::Undefined)
      fail(n.line, "'" + op + "' of an undefined value");
    if (op == "+") {
      if (l.kind == Value::String && r.kind == Value::String) return Value::string(l.s + r.s);
      if (l.kind == Value::ListKind && r.kind == Value::ListKind) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::makeList(std::move(out));
      }
    }
    if (op == "*" && ((l.kind == Value::String && r.kind == Value::Int) || (l.kind == Value::Int && r.kind == Value::String))) {
      const Value& s = l.kind == Value::String ? l : r;
      int64_t times = l.kind == Value::Int ? l.i : r.i;
      std::string out;
      for (int64_t k = 0; k < times; ++k) out += s.s;
      return Value::string(out);
    }
    if (op == "%" && l.kind == Value::String) {  // "%s" formatting of one value or a list
      List args = r.kind == Value::ListKind ? *r.list : List{r};
      std::string out;
      size_t a = 0;
      for (size_t k = 0; k < l.s.size(); ++k) {
        if (l.s[k] != '%' || k + 1 >= l.s.size()) { out += l.s[k]; continue; }
        char f = l.s[++k];
        if (f == '%') { out += '%'; continue; }
        if (a >= args.size()) fail(n.line, "not enough arguments for format string");
        out += f == 'r' ? repr(args[a++]) : f == 'd' ? std::to_string(intOf(args[a++])) : str(args[a++]);
      }
      return Value::string(out);
    }
    if (!isNumber(l) || !isNumber(r))
      fail(n.line, std::string("unsupported operand types for ") + op + ": " + kindName(l) + " and " + kindName(r));
    bool ints = l.kind != Value::Float && r.kind != Value::Float;
    if (op == "/") {
      if (num(r) == 0) fail(n.line, "division by zero");
      return Value::real(num(l) / num(r));
    }
    if (ints) {
      int64_t x = intOf(l), y = intOf(r);
      if (op == "+") return Value::integer(x + y);
      if (op == "-") return Value::integer(x - y);
      if (op == "*") return Value::integer(x * y);
      if (op == "**") {
        if (y < 0) return Value::real(std::pow(double(x), double(y)));
        int64_t p = 1;
        for (int64_t k = 0; k < y; ++k) p *= x;
        return Value::integer(p);
      }
      if (y == 0) fail(n.line, "integer division or modulo by zero");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) { --q; m += y; }  // Python's floor semantics
      return Value::integer(op == "//" ? q : m);
    }
    double x = num(l), y = num(r);
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "**") return Value::real(std::pow(x, y));
    if (y == 0) fail(n.line, "float division or modulo by zero");
    double q = std::floor(x / y);
    return Value::real(op == "//" ? q : x - q * y);
  }

  // Arguments of a call, filter or test (n.kids from `first`): positional, then by name.
  struct Args {
    List pos;
    std::map<std::string, Value> kw;
    const Value* at(size_t k, const char* name) const {
      if (k < pos.size()) return &pos[k];
      auto it = kw.find(name);
      return it == kw.end() ? nullptr : &it->second;
    }
  };
  Args arguments(const N& n, size_t first = 0) {
    Args a;
    size_t npos = n.kids.size() - n.kwnames.size();
    for (size_t k = first; k < n.kids.size(); ++k) {
      Value v = eval(*n.kids[k]);
      if (k < npos) a.pos.push_back(std::move(v));
      else a.kw[n.kwnames[k - npos]] = std::move(v);
    }
    return a;
  }

  static std::string strArg(const Args& a, size_t k, const char* name, int line, const std::string& dflt = "") {
    const Value* v = a.at(k, name);
    if (!v || v->kind == Value::None) return dflt;
    if (v->kind != Value::String) fail(line, std::string("argument '") + name + "' must be a string");
    return v->s;
  }

  Value call(const N& n) {
    const N& callee = *n.a;
    Args a = arguments(n);
    if (callee.kind == N::Name) {
      const std::string& f = callee.name;
      if (f == "raise_exception") throw RaisedError(a.pos.empty() ? "raise_exception()" : str(a.pos[0]));
      if (f == "namespace") {
        Value ns = Value::makeDict();
        ns.kind = Value::Namespace;
        if (!a.pos.empty() && (a.pos[0].kind == Value::DictKind))
          for (const auto& kv : *a.pos[0].dict) ns.set(kv.first, kv.second);
        for (const auto& kv : a.kw) ns.set(kv.first, kv.second);
        return ns;
      }
      if (f == "range") {
        int64_t start = 0, stop = 0, step = 1;
        if (a.pos.size() == 1) stop = intOf(a.pos[0]);
        else if (a.pos.size() >= 2) { start = intOf(a.pos[0]); stop = intOf(a.pos[1]); }
        if (a.pos.size() == 3) step = intOf(a.pos[2]);
        if (step == 0) fail(n.line, "range() step cannot be zero");
        List out;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(Value::integer(k));
        return Value::makeList(std::move(out));
      }
      if (f == "dict") {
        Value d = Value::makeDict();
        for (const auto& kv : a.kw) d.set(kv.first, kv.second);
        return d;
      }
      if (f == "strftime_now") {
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        gmtime_r(&now, &tm);
        char buf[256];
        size_t len = std::strftime(buf, sizeof buf, strArg(a, 0, "format", n.line).c_str(), &tm);
        return Value::string(std::string(buf, len));
      }
      Value v = lookup(f, n.line);
      fail(n.line, v.kind == Value::Undefined ? "'" + f + "' is undefined" : "'" + f + "' is not callable");
    }
    if (callee.kind != N::GetAttr) fail(n.line, "this expression is not callable");
    Value self = eval(*callee.a);
    const std::string& m = callee.name;
    if (self.kind == Value::String) {
      const std::string& s = self.s;
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const Value* c = a.at(0, "chars");
        std::string chars = c && c->kind == Value::String ? c->s : "";
        return Value::string(strip(s, c && c->kind == Value::String ? &chars : nullptr, m != "rstrip", m != "lstrip"));
      }
      if (m == "upper") return Value::string(upper(s));
      if (m == "lower") return Value::string(lower(s));
      if (m == "title") return Value::string(title(s));
      if (m == "capitalize") return Value::string(capitalize(s));
      if (m == "startswith" || m == "endswith") {
        const Value* p = a.at(0, "prefix");
        if (!p) fail(n.line, m + "() takes an argument");
        List options = p->kind == Value::ListKind ? *p->list : List{*p};
        for (const Value& o : options) {
          if (o.kind != Value::String) fail(n.line, m + "() takes strings");
          bool hit = m == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                       : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
          if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (m == "split" || m == "rsplit") {
        const Value* sep = a.at(0, "sep");
        const Value* max = a.at(1, "maxsplit");
        if (m == "rsplit" && max && intOf(*max) >= 0) fail(n.line, "rsplit with maxsplit is not supported");
        return Value::makeList(split(s, sep, max ? intOf(*max) : -1));
      }
      if (m == "replace") {
        const Value* c = a.at(2, "count");
        return Value::string(replaceAll(s, strArg(a, 0, "old", n.line), strArg(a, 1, "new", n.line), c ? intOf(*c) : -1));
      }
      if (m == "join") {
        const Value* l = a.at(0, "iterable");
        std::string out;
        List parts = l ? items(*l, n.line) : List{};
        for (size_t k = 0; k < parts.size(); ++k) out += (k ? s : "") + str(parts[k]);
        return Value::string(out);
      }
      if (m == "find") {
        size_t at = s.find(strArg(a, 0, "sub", n.line));
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(at));
      }
      if (m == "count") {
        std::string sub = strArg(a, 0, "sub", n.line);
        int64_t c = 0;
        for (size_t k = sub.empty() ? std::string::npos : s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++c;
        return Value::integer(c);
      }
    }
    if (self.kind == Value::DictKind || self.kind == Value::Namespace) {
      if (m == "items" || m == "keys" || m == "values") {
        List out;
        for (const auto& kv : *self.dict) {
          if (m == "items") out.push_back(Value::makeList({Value::string(kv.first), kv.second}));
          else out.push_back(m == "keys" ? Value::string(kv.first) : kv.second);
        }
        return Value::makeList(std::move(out));
      }
      if (m == "get") {
        const Value* v = self.get(strArg(a, 0, "key", n.line));
        if (v) return *v;
        const Value* d = a.at(1, "default");
        return d ? *d : Value::none();
      }
    }
    if (self.kind == Value::Undefined) fail(n.line, "'" + m + "()' of an undefined value");
    fail(n.line, std::string("a ") + kindName(self) + " has no method '" + m + "' in chat templates");
  }

  bool testValue(const std::string& t, const Value& v, const List& args, int line) {
    if (t == "defined") return v.kind != Value::Undefined;
    if (t == "undefined") return v.kind == Value::Undefined;
    if (t == "none") return v.kind == Value::None;
    if (t == "string") return v.kind == Value::String;
    if (t == "number") return v.kind == Value::Int || v.kind == Value::Float;
    if (t == "integer") return v.kind == Value::Int;
    if (t == "float") return v.kind == Value::Float;
    if (t == "boolean") return v.kind == Value::Bool;
    if (t == "true") return v.kind == Value::Bool && v.b;
    if (t == "false") return v.kind == Value::Bool && !v.b;
    if (t == "mapping") return v.kind == Value::DictKind;
    if (t == "sequence" || t == "iterable")
      return v.kind == Value::ListKind || v.kind == Value::String || v.kind == Value::DictKind;
    if (t == "callable") return false;
    if (t == "lower") return v.kind == Value::String && lower(v.s) == v.s;
    if (t == "upper") return v.kind == Value::String && upper(v.s) == v.s;
    if (t == "odd" || t == "even") return isNumber(v) && (intOf(v) % 2 != 0) == (t == "odd");
    if (t == "divisibleby") return !args.empty() && intOf(args[0]) != 0 && intOf(v) % intOf(args[0]) == 0;
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return !args.empty() && equal(v, args[0]);
    if (t == "ne" || t == "!=") return !args.empty() && !equal(v, args[0]);
    if (t == "in") {
      if (args.empty()) return false;
      const Value& c = args[0];
      if (c.kind == Value::String) return v.kind == Value::String && c.s.find(v.s) != std::string::npos;
      if (c.kind == Value::DictKind) return v.kind == Value::String && c.get(v.s);
      for (const Value& x : items(c, line))
        if (equal(x, v)) return true;
      return false;
    }
    fail(line, "no test named '" + t + "'");
  }

  bool test(const N& n) {
    Value v = eval(*n.a);
    Args a = arguments(n);
    return testValue(n.name, v, a.pos, n.line);
  }

  Value filter(const N& n) {
    Value v = eval(*n.a);
    Args a = arguments(n);
    return applyFilter(n.name, v, a, n.line);
  }

  Value applyFilter(const std::string& f, const Value& v, const Args& a, int line) {
    if (f == "trim") {
      std::string chars = strArg(a, 0, "chars", line);
      return Value::string(strip(str(v), a.at(0, "chars") ? &chars : nullptr, true, true));
    }
    if (f == "upper") return Value::string(upper(str(v)));
    if (f == "lower") return Value::string(lower(str(v)));
    if (f == "capitalize") return Value::string(capitalize(str(v)));
    if (f == "title") return Value::string(title(str(v)));
    if (f == "string") return Value::string(str(v));
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
      if (f == "safe") return v;
      std::string out;
      for (char c : str(v)) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
        }
      }
      return Value::string(out);
    }
    if (f == "length" || f == "count") {
      if (v.kind == Value::String) return Value::integer(static_cast<int64_t>(utf8Length(v.s)));
      if (v.kind == Value::ListKind) return Value::integer(static_cast<int64_t>(v.list->size()));
      if (v.kind == Value::DictKind || v.kind == Value::Namespace) return Value::integer(static_cast<int64_t>(v.dict->size()));
      if (v.kind == Value::Undefined) return Value::integer(0);
      fail(line, std::string("a ") + kindName(v) + " has no length");
    }
    if (f == "default" || f == "d") {
      const Value* b = a.at(1, "boolean");
      bool useFalsy = b && truthy(*b);
      if (v.kind == Value::Undefined || (useFalsy && !truthy(v))) {
        const Value* d = a.at(0, "default_value");
        return d ? *d : Value::string("");
      }
      return v;
    }
    if (f == "first" || f == "last") {
      List all = items(v, line);
      if (all.empty()) return Value();
      return f == "first" ? all.front() : all.back();
    }
    if (f == "list") return Value::makeList(items(v, line));
    if (f == "reverse") {
      if (v.kind == Value::String) {
        List all = items(v, line);
        std::string out;
        for (auto it = all.rbegin(); it != all.rend(); ++it) out += it->s;
        return Value::string(out);
      }
      List all = items(v, line);
      std::reverse(all.begin(), all.end());
      return Value::makeList(std::move(all));
    }
    if (f == "join") {
      std::string sep = strArg(a, 0, "d", line);
      const Value* attr = a.at(1, "attribute");
      std::string out;
      List all = items(v, line);
      for (size_t k = 0; k < all.size(); ++k)
        out += (k ? sep : "") + str(attr ? attribute(all[k], str(*attr), line) : all[k]);
      return Value::string(out);
    }
    if (f == "int") {
      if (v.kind == Value::String) {
        try { return Value::integer(std::stoll(v.s)); } catch (...) { return Value::integer(0); }
      }
      return isNumber(v) ? Value::integer(intOf(v)) : Value::integer(0);
    }
    if (f == "float") return isNumber(v) ? Value::real(num(v)) : Value::real(0);
    if (f == "abs") {
      if (!isNumber(v)) fail(line, "abs of a non-number");
      return v.kind == Value::Float ? Value::real(std::fabs(v.f)) : Value::integer(std::llabs(intOf(v)));
    }
    if (f == "replace") {
      const Value* c = a.at(2, "count");
      return Value::string(replaceAll(str(v), strArg(a, 0, "old", line), strArg(a, 1, "new", line), c ? intOf(*c) : -1));
    }
    if (f == "tojson") {
      const Value* ind = a.at(0, "indent");
      return Value::string(toJson(v, ind && ind->kind == Value::Int ? static_cast<int>(ind->i) : -1));
    }
    if (f == "items") {
      if (v.kind != Value::DictKind) fail(line, "items of a non-dict");
      List out;
      for (const auto& kv : *v.dict) out.push_back(Value::makeList({Value::string(kv.first), kv.second}));
      return Value::makeList(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      bool byAttr = f == "selectattr" || f == "rejectattr";
      bool keepIf = f == "selectattr" || f == "select";
      size_t k = 0;
      std::string attr = byAttr ? strArg(a, k++, "attribute", line) : "";
      const Value* t = a.at(k, "test");
      List testArgs(a.pos.begin() + static_cast<long>(std::min(a.pos.size(), k + 1)), a.pos.end());
      List out;
      for (const Value& x : items(v, line)) {
        Value subject = byAttr ? (x.kind == Value::DictKind ? attribute(x, attr, line) : Value()) : x;
        bool r = t ? testValue(str(*t), subject, testArgs, line) : truthy(subject);
        if (r == keepIf) out.push_back(x);
      }
      return Value::makeList(std::move(out));
    }
    if (f == "map") {
      List out;
      const Value* attr = a.kw.count("attribute") ? &a.kw.at("attribute") : nullptr;
      for (const Value& x : items(v, line)) {
        if (attr) {
          Value r = x.kind == Value::DictKind ? attribute(x, str(*attr), line) : Value();
          if (r.kind == Value::Undefined && a.kw.count("default")) r = a.kw.at("default");
          out.push_back(r);
        } else {
          if (a.pos.empty()) fail(line, "map needs a filter name or attribute=");
          Args rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          out.push_back(applyFilter(str(a.pos[0]), x, rest, line));
        }
      }
      return Value::makeList(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (const Value& x : items(v, line))
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
      return Value::makeList(std::move(out));
    }
    if (f == "sort") {
      List all = items(v, line);
      const Value* rev = a.at(0, "reverse");
      std::vector<size_t> order(all.size());  // a stable sort, as Python's
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        int c = compare(all[x], all[y], line);
        return c != 0 ? c < 0 : x < y;
      });
      List sorted;
      for (size_t k : order) sorted.push_back(all[k]);
      all = std::move(sorted);
      if (rev && truthy(*rev)) std::reverse(all.begin(), all.end());
      return Value::makeList(std::move(all));
    }
    if (f == "indent") {
      const Value* w = a.at(0, "width");
      std::string pad(static_cast<size_t>(w ? intOf(*w) : 4), ' ');
      const Value* firstLine = a.at(1, "first");
      std::string s = str(v), out;
      if (firstLine && truthy(*firstLine)) out += pad;
      for (size_t k = 0; k < s.size(); ++k) {
        out += s[k];
        if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
      }
      return Value::string(out);
    }
    fail(line, "no filter named '" + f + "'");
  }

  std::vector<std::map<std::string, Value>> scopes_;
};

}  // namespace

size_t spaceLength(const std::string& s, size_t k) { return format::SpaceLength(s.data(), s.size(), k); }

std::string stripSpace(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  format::StripSpace(s.data(), &b, &e, left, right);
  return s.substr(b, e - b);
}

std::string toJson(const Value& value, int indent) {
  std::string out;
  json(out, value, indent, 0);
  return out;
}

Template::Template(const std::string& source) : root_(StmtParser(lex(source)).parse()) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  Evaluator e(context);
  std::string out;
  try {
    e.run(*root_, out);
  } catch (const LoopSignal&) {
    throw Error("'break' or 'continue' outside of a loop");
  }
  return out;
}

} // namespace kiln::jinja
