// Values of the Jinja interpreter (internal to runtime/text/jinja*).
//
// The interpreter mirrors Python: a template sees Python objects, and every
// rule that decides what text comes out (str() of a float, repr() of a list,
// json.dumps key order, truthiness, == between int and float) is Python's. So
// Value models exactly the Python types that chat templates meet: None, bool,
// int, float, str, list/tuple (and the lazy iterators Jinja filters return),
// dict (insertion-ordered, like Python's), plus Jinja's own Undefined,
// Namespace and callables (macros, builtin functions, bound methods).
//
// Lists, dicts and strings are immutable and shared: copying a Value is cheap,
// which matters because Jinja passes values around freely. Namespaces are the
// one mutable object ({% set ns.x = ... %}) and are shared by reference, as in
// Python.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_VALUE_H_
#define TESSERA_RUNTIME_TEXT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace jinja {

// The deepest nesting of lists, dicts and namespaces a value may have. Every
// walk over a value (printing, ==, <, tojson) recurses once per level, so the
// interpreter refuses a value deeper than this (InvalidArgument) wherever one
// is built: client JSON is at most kMaxJsonDepth (64) deep, and a template may
// wrap it a few more times. Walks that follow namespaces (which are mutable,
// so their depth is not fixed when a value is built) check the limit as they
// go.
inline constexpr int kMaxValueDepth = 128;

// The longest string one operation may build (a join, a replace, str(list),
// tojson, padding): past it the operation fails instead of allocating.
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;

class Value;
class Dict;
struct Callable;

using ValueList = std::vector<Value>;

// What a list-like value is in Python. Rendering, len() and indexing differ.
enum class ListFlavor : uint8_t {
  kList,        // list
  kTuple,       // tuple
  kIterator,    // a generator or iterator (select, map, reverse, ...)
  kDictItems,   // dict.items()
  kDictKeys,    // dict.keys()
  kDictValues,  // dict.values()
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
  };

  Value() = default;  // Undefined.

  // `hint` says why it is undefined ("'x' is undefined"); it becomes the
  // error message when the value is used in a way Undefined forbids.
  static Value Undefined(std::string hint = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  // `markup` marks a markupsafe.Markup string (from |safe or |escape):
  // `markup + str` HTML-escapes the str, as Python's Markup.__add__ does.
  static Value String(std::string s, bool markup = false);
  static Value List(ValueList items, ListFlavor flavor = ListFlavor::kList);
  static Value Tuple(ValueList items) {
    return List(std::move(items), ListFlavor::kTuple);
  }
  static Value FromDict(Dict dict);
  static Value NewNamespace(Dict attrs);
  static Value Function(std::shared_ptr<const Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's numbers.Number).
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  // int/bool/float as a double.
  double as_double() const;
  // int or bool as an int64.
  int64_t as_integer() const;
  const std::string& as_string() const { return *std::get<StrPtr>(data_); }
  bool is_markup() const { return markup_; }
  const ValueList& as_list() const { return *std::get<ListPtr>(data_); }
  ListFlavor flavor() const { return flavor_; }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  Dict& namespace_attrs() const { return *std::get<NsPtr>(data_); }
  const Callable& as_callable() const { return *std::get<FnPtr>(data_); }
  // Why this Undefined is undefined ("" when unknown).
  const std::string& undefined_hint() const;

  // Identity of the shared object behind a list/dict/namespace/callable
  // (Python's `is`); nullptr for scalars.
  const void* identity() const;

  // Levels of list/dict/namespace nesting when the value was built: 0 for a
  // scalar, 1 + the deepest item for a container. Lists and dicts are
  // immutable, so theirs is exact; a namespace's may grow after it is built
  // ({% set ns.x = ... %}).
  int depth() const { return static_cast<int>(depth_); }

 private:
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const ValueList>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NsPtr = std::shared_ptr<Dict>;
  using FnPtr = std::shared_ptr<const Callable>;

  Kind kind_ = Kind::kUndefined;
  ListFlavor flavor_ = ListFlavor::kList;
  bool markup_ = false;
  uint32_t depth_ = 0;
  std::variant<std::monostate, bool, int64_t, double, StrPtr, ListPtr, DictPtr,
               NsPtr, FnPtr>
      data_;
};

// An insertion-ordered mapping, like Python's dict. Lookups are linear: chat
// template dicts (messages, tool schemas) are small.
class Dict {
 public:
  using Entry = std::pair<Value, Value>;

  const Value* Find(const Value& key) const;
  const Value* Find(absl::string_view key) const;
  // Replaces the value of an existing key (keeping its position) or appends.
  void Set(Value key, Value value);
  // Appends a key the caller knows is new (JSON object members).
  void AppendNew(Value key, Value value) {
    entries_.emplace_back(std::move(key), std::move(value));
  }
  const std::vector<Entry>& entries() const { return entries_; }
  // The value of the i-th entry, for objects that update fields in place.
  Value& value_at(size_t i) { return entries_[i].second; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;
};

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  ValueList args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// A function value: a macro, a global (range, namespace, raise_exception), a
// bound method ("abc".strip) or loop.cycle.
struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(CallArgs)> fn;
};

// --- Python semantics -------------------------------------------------------

// Python's type name of a value ("str", "NoneType", "list", ...), for errors.
std::string TypeName(const Value& v);

// bool(v). Undefined, None, 0, 0.0, "", empty list/dict are false; iterators
// (generators) are always true, as in Python.
bool Truthy(const Value& v);

// Python ==. int/float/bool compare numerically; lists and tuples element by
// element; dicts as unordered mappings; Undefined equals Undefined.
// Namespaces compare by identity, so the recursion follows only lists and
// dicts: at most depth() levels, which the interpreter keeps within
// kMaxValueDepth.
bool Equals(const Value& a, const Value& b);

// Python's <: -1, 0 or 1 for a <=> b, or InvalidArgument for types Python
// cannot order ("'<' not supported between instances of 'str' and 'int'")
// or for values nested deeper than kMaxValueDepth.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// str(v) as Jinja prints it in {{ }}: Undefined -> "", None -> "None",
// True -> "True", 1.0 -> "1.0", ['a'] -> "['a']". A namespace that contains
// itself prints as Python prints a recursive dict ("{...}"). InvalidArgument
// when the value is nested deeper than kMaxValueDepth (through namespaces)
// or the text would be longer than kMaxStringBytes.
absl::StatusOr<std::string> ToPyStr(const Value& v);

// repr(v): strings quoted as Python quotes them. Errors as ToPyStr.
absl::StatusOr<std::string> ToPyRepr(const Value& v);

// Python's repr(float): the shortest string that reads back to the same
// double, in Python's fixed/exponent layout (1e+16, 1e-05, 0.1, 1.0, inf).
std::string PyFloatRepr(double f);

// Python's repr(str).
std::string PyStringRepr(absl::string_view s);

// Options of json.dumps as transformers' tojson passes them.
struct JsonOptions {
  // indent=None (one line) unless set; then a newline and `indent` once per
  // level before each item (Python turns indent=N into N spaces).
  bool indent_set = false;
  std::string indent;
  // Unless set, Python's defaults: (", ", ": "), or (",", ": ") with indent.
  bool separators_set = false;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// json.dumps(v, ...). InvalidArgument for what Python cannot serialize
// (Undefined, namespaces, functions), for values nested deeper than
// kMaxValueDepth and for text longer than kMaxStringBytes.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// A JSON document as the Python objects json.loads would give.
// InvalidArgument ("JSON nested deeper than 64 levels") when `json` has more
// than `max_depth` levels of arrays/objects: the conversion recurses once per
// level and stops there, so a caller that did not check the text first
// (CheckJsonNesting) still gets an error, not a stack overflow.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json,
                               int max_depth);

// --- UTF-8 and Python str helpers -------------------------------------------

std::u32string DecodeUtf8(absl::string_view s);
std::string EncodeUtf8(std::u32string_view s);
void AppendUtf8(char32_t c, std::string* out);
bool IsAscii(absl::string_view s);
// len(s) in code points.
size_t Utf8Length(absl::string_view s);
// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c);
// Python's str.strip/lstrip/rstrip. `chars` null: whitespace.
std::string PyStrip(absl::string_view s, const std::string* chars, bool left,
                    bool right);
// Simple Unicode case mappings (utf8proc), per code point.
std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
// Python's str.title() and str.capitalize().
std::string PyTitle(absl::string_view s);
std::string PyCapitalize(absl::string_view s);
// Python's str.splitlines() (without keepends).
std::vector<std::string> PySplitLines(absl::string_view s);

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_VALUE_H_
