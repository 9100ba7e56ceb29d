// A small JSON reader for kiln-bench --compare (it reads kiln-bench's own output):
// objects, arrays, strings (with \uXXXX escapes of the basic plane), numbers,
// true/false/null. Errors name the byte offset.
#ifndef KILN_TOOLS_KILN_BENCH_JSON_H_
#define KILN_TOOLS_KILN_BENCH_JSON_H_

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::tools {

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json* Get(const std::string& key) const {
    auto it = fields.find(key);
    return kind == Object && it != fields.end() ? &it->second : nullptr;
  }
  double Num(const std::string& key, double fallback = 0) const {
    const Json* j = Get(key);
    return j && j->kind == Number ? j->number : fallback;
  }
  std::string Str(const std::string& key) const {
    const Json* j = Get(key);
    return j && j->kind == String ? j->str : std::string();
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : s_(text) {}

  bool Parse(Json* out, std::string* error) {
    if (!Value(out, 0) || (Space(), pos_ != s_.size())) {
      *error = error_.empty() ? "unexpected text at byte " + std::to_string(pos_) : error_;
      return false;
    }
    return true;
  }

 private:
  void Space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_);
    return false;
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return Fail("unknown literal");
    pos_ += w.size();
    return true;
  }
  bool StringValue(std::string* out) {
    ++pos_;  // the opening quote
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return Fail("short \\u escape");
          unsigned cp = static_cast<unsigned>(std::strtoul(s_.substr(pos_, 4).c_str(), nullptr, 16));
          pos_ += 4;
          if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          } else {
            out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          }
          break;
        }
        default: out->push_back(e);
      }
    }
    if (pos_ >= s_.size()) return Fail("unterminated string");
    ++pos_;
    return true;
  }
  bool Value(Json* out, int depth) {
    if (depth > 64) return Fail("nesting too deep");
    Space();
    if (pos_ >= s_.size()) return Fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') {
      out->kind = Json::Object;
      ++pos_;
      Space();
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
      for (;;) {
        Space();
        if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a key");
        std::string key;
        if (!StringValue(&key)) return false;
        Space();
        if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
        ++pos_;
        if (!Value(&out->fields[key], depth + 1)) return false;
        Space();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
        return Fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      out->kind = Json::Array;
      ++pos_;
      Space();
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
      for (;;) {
        out->items.emplace_back();
        if (!Value(&out->items.back(), depth + 1)) return false;
        Space();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
        return Fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      out->kind = Json::String;
      return StringValue(&out->str);
    }
    if (c == 't') return out->kind = Json::Bool, out->b = true, Literal("true");
    if (c == 'f') return out->kind = Json::Bool, Literal("false");
    if (c == 'n') return Literal("null");
    const char* begin = s_.c_str() + pos_;
    char* end = nullptr;
    out->number = std::strtod(begin, &end);
    if (end == begin) return Fail("unexpected character");
    out->kind = Json::Number;
    pos_ += static_cast<size_t>(end - begin);
    return true;
  }

  const std::string s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace kiln::tools

#endif  // KILN_TOOLS_KILN_BENCH_JSON_H_
