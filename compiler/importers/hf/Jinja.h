//===- Jinja.h - The Jinja subset of chat templates --------------*- C++ -*-===//
//
// Evaluates the Jinja2 that Hugging Face chat templates are written in, the way
// transformers' apply_chat_template does: an immutable sandbox with trim_blocks
// and lstrip_blocks, the loopcontrols extension ({% break %}, {% continue %}),
// transformers' {% generation %} blocks, and its globals raise_exception() and
// strftime_now(), and its tojson (json.dumps with ensure_ascii=False).
//
// The subset: text, {{ }}, {% if/elif/else %}, {% for ... in ... [if ...] %} with
// else and the loop variable, {% set %} (names, namespace attributes, blocks),
// comments, whitespace control (- and +); expressions with Python's semantics for
// strings, numbers, lists, dicts and None; the filters and tests real templates
// use (docs/chat-templates.md lists them). Anything else (macros, call blocks,
// includes) is an error naming the line. Only the compiler evaluates templates: the
// runtime applies the pieces ChatTemplate.h derives from them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_HF_JINJA_H
#define KILN_COMPILER_IMPORTERS_HF_JINJA_H

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's

/// A Jinja value. Lists and dicts are shared: a namespace() is a mutable dict.
struct Value {
  enum Kind { Undefined, None, Bool, Int, Float, String, ListKind, DictKind, Namespace };
  Kind kind = Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;

  Value() = default;
  static Value none() { Value v; v.kind = None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = String; v.s = std::move(x); return v; }
  static Value makeList(List items = {}) {
    Value v; v.kind = ListKind; v.list = std::make_shared<List>(std::move(items)); return v;
  }
  static Value makeDict(Dict items = {}) {
    Value v; v.kind = DictKind; v.dict = std::make_shared<Dict>(std::move(items)); return v;
  }
  /// The member `key` of a dict (nullptr when absent).
  const Value* get(const std::string& key) const;
  void set(const std::string& key, Value value);  // dicts and namespaces
};

/// A template that cannot be parsed or evaluated: the message names the line.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// raise_exception("...") called by the template itself (e.g. "Conversation roles
/// must alternate user/assistant/user/assistant/...").
struct RaisedError : Error {
  using Error::Error;
};

class Template {
public:
  /// Parses `source`; throws Error.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  /// Renders with the variables of `context` (a dict); throws Error / RaisedError.
  std::string render(const Value& context) const;

  struct Node;
private:
  std::unique_ptr<Node> root_;
};

/// The bytes of the whitespace code point (Python's str.isspace(): ASCII whitespace,
/// U+001C-U+001F, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
/// U+205F, U+3000) at s[k] in UTF-8; 0 when s[k] starts none.
size_t spaceLength(const std::string& s, size_t k);

/// Python's str.strip() (left and right), lstrip() or rstrip() without arguments.
std::string stripSpace(const std::string& s, bool left, bool right);

/// Python's json.dumps(value, ensure_ascii=False[, indent]) (transformers' tojson).
std::string toJson(const Value& value, int indent = -1);

} // namespace kiln::jinja

#endif // KILN_COMPILER_IMPORTERS_HF_JINJA_H
