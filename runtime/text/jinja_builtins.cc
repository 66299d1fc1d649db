#include "runtime/text/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/core/status.h"
#include "utf8proc.h"

namespace tessera {
namespace jinja {
namespace {

// --- Names -------------------------------------------------------------------

const absl::flat_hash_set<absl::string_view>& JinjaFilters() {
  static const auto* const kNames = new absl::flat_hash_set<absl::string_view>{
      "abs",      "attr",       "batch",       "capitalize",
      "center",   "count",      "d",           "default",
      "dictsort", "e",          "escape",      "filesizeformat",
      "first",    "float",      "forceescape", "format",
      "groupby",  "indent",     "int",         "items",
      "join",     "last",       "length",      "list",
      "lower",    "map",        "max",         "min",
      "pprint",   "random",     "reject",      "rejectattr",
      "replace",  "reverse",    "round",       "safe",
      "select",   "selectattr", "slice",       "sort",
      "string",   "striptags",  "sum",         "title",
      "tojson",   "trim",       "truncate",    "unique",
      "upper",    "urlencode",  "urlize",      "wordcount",
      "wordwrap", "xmlattr"};
  return *kNames;
}

const absl::flat_hash_set<absl::string_view>& JinjaTests() {
  static const auto* const kNames = new absl::flat_hash_set<absl::string_view>{
      "odd",      "even",        "divisibleby", "defined",  "undefined",
      "filter",   "test",        "none",        "boolean",  "false",
      "true",     "integer",     "float",       "lower",    "upper",
      "string",   "mapping",     "number",      "sequence", "iterable",
      "callable", "sameas",      "escaped",     "in",       "==",
      "eq",       "equalto",     "!=",          "ne",       ">",
      "gt",       "greaterthan", "ge",          ">=",       "<",
      "lt",       "lessthan",    "<=",          "le"};
  return *kNames;
}

// Every method of Python's str, dict and list: a name here that is not
// implemented is "unsupported"; any other name is simply undefined.
const absl::flat_hash_set<absl::string_view>& StrMethods() {
  static const auto* const kNames = new absl::flat_hash_set<absl::string_view>{
      "capitalize",   "casefold",     "center",    "count",     "encode",
      "endswith",     "expandtabs",   "find",      "format",    "format_map",
      "index",        "isalnum",      "isalpha",   "isascii",   "isdecimal",
      "isdigit",      "isidentifier", "islower",   "isnumeric", "isprintable",
      "isspace",      "istitle",      "isupper",   "join",      "ljust",
      "lower",        "lstrip",       "maketrans", "partition", "removeprefix",
      "removesuffix", "replace",      "rfind",     "rindex",    "rjust",
      "rpartition",   "rsplit",       "rstrip",    "split",     "splitlines",
      "startswith",   "strip",        "swapcase",  "title",     "translate",
      "upper",        "zfill"};
  return *kNames;
}

bool IsDictMethod(absl::string_view name) {
  return name == "get" || name == "items" || name == "keys" ||
         name == "values" || name == "copy" || name == "fromkeys";
}
bool IsMutatingDictMethod(absl::string_view name) {
  return name == "clear" || name == "pop" || name == "popitem" ||
         name == "setdefault" || name == "update";
}
bool IsListMethod(absl::string_view name) {
  return name == "count" || name == "index" || name == "copy";
}
bool IsMutatingListMethod(absl::string_view name) {
  return name == "append" || name == "clear" || name == "extend" ||
         name == "insert" || name == "pop" || name == "remove" ||
         name == "reverse" || name == "sort";
}

bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

absl::Status TypeError(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status Unsupported(absl::string_view what, absl::string_view name) {
  return absl::UnimplementedError(
      absl::StrCat("unsupported ", what, " \"", name, "\""));
}

// --- Argument binding
// ---------------------------------------------------------

// Python-style binding of a call's arguments to named parameters.
class Params {
 public:
  static absl::StatusOr<Params> Bind(
      absl::string_view function, const CallArgs& call,
      std::initializer_list<absl::string_view> names) {
    Params p;
    p.values_.resize(names.size());
    const std::vector<absl::string_view> list(names);
    if (call.args.size() > list.size()) {
      return TypeError(absl::StrCat(function, "() takes at most ", list.size(),
                                    " argument(s) (", call.args.size(),
                                    " given)"));
    }
    for (size_t i = 0; i < call.args.size(); ++i) p.values_[i] = call.args[i];
    for (const auto& [key, value] : call.kwargs) {
      const auto it = std::find(list.begin(), list.end(), key);
      if (it == list.end()) {
        return TypeError(absl::StrCat(
            function, "() got an unexpected keyword argument '", key, "'"));
      }
      const size_t index = static_cast<size_t>(it - list.begin());
      if (p.values_[index].has_value()) {
        return TypeError(absl::StrCat(
            function, "() got multiple values for argument '", key, "'"));
      }
      p.values_[index] = value;
    }
    return p;
  }

  bool Has(size_t i) const { return values_[i].has_value(); }
  // The argument, or `fallback` when it was not passed.
  Value Get(size_t i, Value fallback = Value::None()) const {
    return values_[i].has_value() ? *values_[i] : std::move(fallback);
  }

 private:
  std::vector<std::optional<Value>> values_;
};

// --- Conversions -----------------------------------------------------------

absl::StatusOr<int64_t> ToIndex(const Value& v, absl::string_view what) {
  if (v.is_int() || v.is_bool()) return v.as_integer();
  if (v.is_undefined()) return UndefinedError(v);
  return TypeError(absl::StrCat(
      "'", TypeName(v), "' object cannot be interpreted as an integer (", what,
      ")"));
}

absl::StatusOr<int64_t> Len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(Utf8Length(v.as_string()));
    case Value::Kind::kList:
      if (v.flavor() != ListFlavor::kIterator) {
        return static_cast<int64_t>(v.as_list().size());
      }
      break;
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().size());
    default:
      break;
  }
  return TypeError(
      absl::StrCat("object of type '", TypeName(v), "' has no len()"));
}

std::vector<std::string> Characters(absl::string_view s) {
  std::vector<std::string> out;
  for (char32_t c : DecodeUtf8(s)) {
    std::string one;
    AppendUtf8(c, &one);
    out.push_back(std::move(one));
  }
  return out;
}

Value CharsList(absl::string_view s, ListFlavor flavor = ListFlavor::kList) {
  ValueList items;
  for (std::string& c : Characters(s))
    items.push_back(Value::String(std::move(c)));
  return Value::List(std::move(items), flavor);
}

ValueList DictKeys(const Dict& d) {
  ValueList keys;
  for (const Dict::Entry& e : d.entries()) keys.push_back(e.first);
  return keys;
}

absl::Status TooLarge() {
  return absl::InvalidArgumentError(
      absl::StrCat("value too large (a string over ", kMaxStringBytes,
                   " bytes or a list over 2^20 items)"));
}

// A string being built may not pass kMaxStringBytes.
absl::Status CheckSize(const std::string& out) {
  return out.size() > kMaxStringBytes ? TooLarge() : absl::OkStatus();
}

absl::StatusOr<std::string> HtmlEscape(absl::string_view s) {
  // At most 5 more bytes per byte: check once, before building.
  if (s.size() > kMaxStringBytes / 6) {
    size_t n = s.size();
    for (char c : s) {
      if (c == '&' || c == '<' || c == '>' || c == '"' || c == '\'') n += 4;
    }
    if (n > kMaxStringBytes) return TooLarge();
  }
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Value> Escape(const Value& v) {
  if (v.is_string() && v.is_markup()) return v;
  ASSIGN_OR_RETURN(std::string text, ToPyStr(v));
  ASSIGN_OR_RETURN(std::string escaped, HtmlEscape(text));
  return Value::String(std::move(escaped), /*markup=*/true);
}

// Lowercases strings for case-insensitive sorting/grouping (Jinja's
// ignore_case).
Value IgnoreCase(const Value& v) {
  if (v.is_string()) return Value::String(PyLower(v.as_string()));
  return v;
}

// The parts of an attribute path "a.b.0" (digits become indices), as Jinja's
// make_attrgetter reads them.
ValueList AttributeParts(const Value& attribute) {
  ValueList parts;
  if (attribute.is_none()) return parts;
  if (!attribute.is_string()) {
    parts.push_back(attribute);
    return parts;
  }
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(
        start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
    parts.push_back(digits ? Value::Int(std::strtoll(part.c_str(), nullptr, 10))
                           : Value::String(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

absl::StatusOr<Value> FollowPath(Value item, const ValueList& parts) {
  for (const Value& part : parts) {
    if (item.is_undefined()) return UndefinedError(item);
    item = GetItem(item, part);
  }
  return item;
}

// Python slice index normalisation (PySlice_AdjustIndices) for one bound.
int64_t ClampIndex(int64_t index, int64_t length, bool positive_step) {
  if (index < 0) {
    index += length;
    if (index < 0) index = positive_step ? 0 : -1;
  } else if (index >= length) {
    index = positive_step ? length : length - 1;
  }
  return index;
}

// [start, end) of a Python str method's optional start/end arguments.
absl::StatusOr<std::pair<int64_t, int64_t>> MethodRange(const Value& start,
                                                        const Value& end,
                                                        int64_t length) {
  int64_t s = 0;
  int64_t e = length;
  if (!start.is_none()) {
    ASSIGN_OR_RETURN(s, ToIndex(start, "slice index"));
    if (s < 0) s = std::max<int64_t>(0, s + length);
  }
  if (!end.is_none()) {
    ASSIGN_OR_RETURN(e, ToIndex(end, "slice index"));
    if (e < 0) e = std::max<int64_t>(0, e + length);
    e = std::min(e, length);
  }
  return std::make_pair(s, e);
}

bool IsWordChar(char32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// --- Python str methods
// -------------------------------------------------------

std::vector<std::string> SplitWhitespace(const std::u32string& s,
                                         int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n && IsPySpace(s[i])) ++i;
  while (i < n) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(EncodeUtf8(std::u32string_view(s).substr(i)));
      return out;
    }
    size_t j = i;
    while (j < n && !IsPySpace(s[j])) ++j;
    out.push_back(EncodeUtf8(std::u32string_view(s).substr(i, j - i)));
    i = j;
    while (i < n && IsPySpace(s[i])) ++i;
  }
  return out;
}

std::vector<std::string> RSplitWhitespace(const std::u32string& s,
                                          int64_t maxsplit) {
  std::vector<std::string> out;
  size_t end = s.size();
  while (end > 0 && IsPySpace(s[end - 1])) --end;
  while (end > 0) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(EncodeUtf8(std::u32string_view(s).substr(0, end)));
      break;
    }
    size_t start = end;
    while (start > 0 && !IsPySpace(s[start - 1])) --start;
    out.push_back(
        EncodeUtf8(std::u32string_view(s).substr(start, end - start)));
    end = start;
    while (end > 0 && IsPySpace(s[end - 1])) --end;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitSep(absl::string_view s, absl::string_view sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t found = s.find(sep, start);
    if (found == absl::string_view::npos) break;
    out.emplace_back(s.substr(start, found - start));
    start = found + sep.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> RSplitSep(absl::string_view s, absl::string_view sep,
                                   int64_t maxsplit) {
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t found = s.rfind(sep, end - sep.size());
    if (found == absl::string_view::npos) break;
    out.emplace_back(s.substr(found + sep.size(), end - found - sep.size()));
    end = found;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> Replace(absl::string_view s, absl::string_view old,
                                    absl::string_view replacement,
                                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    const std::vector<std::string> chars = Characters(s);
    int64_t done = 0;
    for (const std::string& c : chars) {
      if (count < 0 || done < count) {
        absl::StrAppend(&out, replacement);
        ++done;
      }
      out += c;
      RETURN_IF_ERROR(CheckSize(out));
    }
    if (count < 0 || done < count) absl::StrAppend(&out, replacement);
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = s.find(old, start);
    if (found == absl::string_view::npos) break;
    absl::StrAppend(&out, s.substr(start, found - start), replacement);
    RETURN_IF_ERROR(CheckSize(out));
    start = found + old.size();
    ++done;
  }
  absl::StrAppend(&out, s.substr(start));
  return out;
}

// Python's str.format for plain fields: "{}", "{0}", "{name}", "{{", "}}".
absl::StatusOr<std::string> PyFormat(absl::string_view fmt,
                                     const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return absl::InvalidArgumentError(
          "Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          "Single '{' encountered in format string");
    }
    absl::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close;
    if (field.find_first_of(":!.[") != absl::string_view::npos) {
      return Unsupported("str.format field", field);
    }
    const Value* value = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) {
          return d >= '0' && d <= '9';
        })) {
      const size_t index = field.empty()
                               ? auto_index++
                               : static_cast<size_t>(std::strtoull(
                                     std::string(field).c_str(), nullptr, 10));
      if (index >= args.args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Replacement index ", index,
                         " out of range for positional args tuple"));
      }
      value = &args.args[index];
    } else {
      for (const auto& [key, v] : args.kwargs) {
        if (key == field) value = &v;
      }
      if (value == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("KeyError: '", field, "'"));
      }
    }
    ASSIGN_OR_RETURN(std::string text, ToPyStr(*value));
    out += text;
    RETURN_IF_ERROR(CheckSize(out));
  }
  return out;
}

// str.center/ljust/rjust (`how`), in code points.
absl::StatusOr<std::string> Pad(absl::string_view s, int64_t width,
                                char32_t fill, absl::string_view how) {
  const int64_t length = static_cast<int64_t>(Utf8Length(s));
  const int64_t margin = width - length;
  if (margin <= 0) return std::string(s);
  // A fill character is at most 4 bytes.
  if (margin > static_cast<int64_t>(kMaxStringBytes / 4)) return TooLarge();
  int64_t left = 0;
  if (how == "center") {
    left = margin / 2 + (margin & width & 1);
  } else if (how == "rjust") {
    left = margin;
  }
  std::string pad_left;
  std::string pad_right;
  for (int64_t i = 0; i < left; ++i) AppendUtf8(fill, &pad_left);
  for (int64_t i = 0; i < margin - left; ++i) AppendUtf8(fill, &pad_right);
  return absl::StrCat(pad_left, s, pad_right);
}

absl::StatusOr<Value> StringMethod(const Value& receiver,
                                   absl::string_view name,
                                   const CallArgs& args) {
  const std::string& s = receiver.as_string();
  const std::string fn = absl::StrCat("str.", name);
  auto string_arg = [&](const Value& v) -> absl::StatusOr<std::string> {
    if (!v.is_string()) {
      return TypeError(
          absl::StrCat(fn, "() argument must be str, not ", TypeName(v)));
    }
    return v.as_string();
  };

  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"chars"}));
    const Value chars = p.Get(0);
    std::string set;
    if (!chars.is_none()) {
      ASSIGN_OR_RETURN(set, string_arg(chars));
    }
    return Value::String(PyStrip(s, chars.is_none() ? nullptr : &set,
                                 name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"sep", "maxsplit"}));
    int64_t maxsplit = -1;
    if (p.Has(1)) {
      ASSIGN_OR_RETURN(maxsplit, ToIndex(p.Get(1), "maxsplit"));
    }
    const Value sep = p.Get(0);
    std::vector<std::string> parts;
    if (sep.is_none()) {
      const std::u32string text = DecodeUtf8(s);
      parts = name == "split" ? SplitWhitespace(text, maxsplit)
                              : RSplitWhitespace(text, maxsplit);
    } else {
      ASSIGN_OR_RETURN(std::string sep_text, string_arg(sep));
      if (sep_text.empty())
        return absl::InvalidArgumentError("empty separator");
      parts = name == "split" ? SplitSep(s, sep_text, maxsplit)
                              : RSplitSep(s, sep_text, maxsplit);
    }
    ValueList items;
    for (std::string& part : parts)
      items.push_back(Value::String(std::move(part)));
    return Value::List(std::move(items));
  }
  if (name == "splitlines") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"keepends"}));
    if (Truthy(p.Get(0, Value::Bool(false)))) {
      return Unsupported("method", "str.splitlines(keepends=True)");
    }
    ValueList items;
    for (std::string& line : PySplitLines(s)) {
      items.push_back(Value::String(std::move(line)));
    }
    return Value::List(std::move(items));
  }
  if (name == "startswith" || name == "endswith") {
    ASSIGN_OR_RETURN(Params p,
                     Params::Bind(fn, args, {"prefix", "start", "end"}));
    ValueList candidates;
    const Value prefix = p.Get(0, Value::Undefined());
    if (prefix.is_list() && prefix.flavor() == ListFlavor::kTuple) {
      candidates = prefix.as_list();
    } else {
      candidates.push_back(prefix);
    }
    const std::u32string text = DecodeUtf8(s);
    ASSIGN_OR_RETURN(
        auto range,
        MethodRange(p.Get(1), p.Get(2), static_cast<int64_t>(text.size())));
    for (const Value& candidate : candidates) {
      if (!candidate.is_string()) {
        return TypeError(
            absl::StrCat(name, " first arg must be str or a tuple of str, not ",
                         TypeName(candidate)));
      }
      const std::u32string c = DecodeUtf8(candidate.as_string());
      if (range.first > range.second ||
          static_cast<int64_t>(c.size()) > range.second - range.first) {
        continue;
      }
      const size_t at = name == "startswith"
                            ? static_cast<size_t>(range.first)
                            : static_cast<size_t>(range.second) - c.size();
      if (text.compare(at, c.size(), c) == 0) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "title" ||
      name == "capitalize" || name == "casefold") {
    RETURN_IF_ERROR(Params::Bind(fn, args, {}).status());
    if (name == "upper") return Value::String(PyUpper(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(PyCapitalize(s));
    return Value::String(PyLower(s));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"old", "new", "count"}));
    ASSIGN_OR_RETURN(std::string old_text,
                     string_arg(p.Get(0, Value::Undefined())));
    ASSIGN_OR_RETURN(std::string new_text,
                     string_arg(p.Get(1, Value::Undefined())));
    int64_t count = -1;
    if (p.Has(2)) {
      ASSIGN_OR_RETURN(count, ToIndex(p.Get(2), "count"));
    }
    ASSIGN_OR_RETURN(std::string replaced,
                     Replace(s, old_text, new_text, count));
    return Value::String(std::move(replaced));
  }
  if (name == "find" || name == "rfind" || name == "index" ||
      name == "rindex" || name == "count") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"sub", "start", "end"}));
    ASSIGN_OR_RETURN(std::string sub_text,
                     string_arg(p.Get(0, Value::Undefined())));
    const std::u32string text = DecodeUtf8(s);
    const std::u32string sub = DecodeUtf8(sub_text);
    ASSIGN_OR_RETURN(
        auto range,
        MethodRange(p.Get(1), p.Get(2), static_cast<int64_t>(text.size())));
    const int64_t start = range.first;
    const int64_t end = range.second;
    if (name == "count") {
      if (start > end) return Value::Int(0);
      if (sub.empty()) return Value::Int(end - start + 1);
      int64_t n = 0;
      size_t at = static_cast<size_t>(start);
      while (true) {
        const size_t found = text.find(sub, at);
        if (found == std::u32string::npos ||
            static_cast<int64_t>(found + sub.size()) > end) {
          break;
        }
        ++n;
        at = found + sub.size();
      }
      return Value::Int(n);
    }
    int64_t found = -1;
    if (start <= end && static_cast<int64_t>(sub.size()) <= end - start) {
      const std::u32string_view window =
          std::u32string_view(text).substr(start, end - start);
      const size_t at = (name == "find" || name == "index") ? window.find(sub)
                                                            : window.rfind(sub);
      if (at != std::u32string_view::npos)
        found = start + static_cast<int64_t>(at);
    }
    if (found < 0 && (name == "index" || name == "rindex")) {
      return absl::InvalidArgumentError("substring not found");
    }
    return Value::Int(found);
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"iterable"}));
    ASSIGN_OR_RETURN(ValueList items, Iterate(p.Get(0, Value::Undefined())));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i,
                                      ": expected str instance, ",
                                      TypeName(items[i]), " found"));
      }
      if (i > 0) out += s;
      out += items[i].as_string();
    }
    return Value::String(std::move(out));
  }
  if (name == "format") {
    ASSIGN_OR_RETURN(std::string formatted, PyFormat(s, args));
    return Value::String(std::move(formatted));
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" ||
      name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper" || name == "isascii") {
    RETURN_IF_ERROR(Params::Bind(fn, args, {}).status());
    const std::u32string text = DecodeUtf8(s);
    if (name == "isascii") return Value::Bool(IsAscii(s));
    if (text.empty()) return Value::Bool(false);
    if (name == "islower" || name == "isupper") {
      bool cased = false;
      for (char32_t c : text) {
        const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
        if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
          if (name == "islower") return Value::Bool(false);
          cased = true;
        } else if (cat == UTF8PROC_CATEGORY_LL) {
          if (name == "isupper") return Value::Bool(false);
          cased = true;
        }
      }
      return Value::Bool(cased);
    }
    for (char32_t c : text) {
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool letter =
          cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
          cat == UTF8PROC_CATEGORY_LT || cat == UTF8PROC_CATEGORY_LM ||
          cat == UTF8PROC_CATEGORY_LO;
      const bool decimal = cat == UTF8PROC_CATEGORY_ND;
      const bool numeric =
          decimal || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
      bool ok = false;
      if (name == "isdigit" || name == "isdecimal") ok = decimal;
      if (name == "isnumeric") ok = numeric;
      if (name == "isalpha") ok = letter;
      if (name == "isalnum") ok = letter || numeric;
      if (name == "isspace") ok = IsPySpace(c);
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"affix"}));
    ASSIGN_OR_RETURN(std::string affix,
                     string_arg(p.Get(0, Value::Undefined())));
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) {
      return Value::String(s.substr(affix.size()));
    }
    if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
    return Value::String(s);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"width", "fillchar"}));
    ASSIGN_OR_RETURN(int64_t width,
                     ToIndex(p.Get(0, Value::Undefined()), "width"));
    std::u32string fill = U" ";
    if (p.Has(1)) {
      ASSIGN_OR_RETURN(std::string f, string_arg(p.Get(1)));
      fill = DecodeUtf8(f);
      if (fill.size() != 1) {
        return TypeError(
            "The fill character must be exactly one character long");
      }
    }
    ASSIGN_OR_RETURN(std::string padded, Pad(s, width, fill[0], name));
    return Value::String(std::move(padded));
  }
  if (name == "zfill") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"width"}));
    ASSIGN_OR_RETURN(int64_t width,
                     ToIndex(p.Get(0, Value::Undefined()), "width"));
    const int64_t length = static_cast<int64_t>(Utf8Length(s));
    if (width <= length) return Value::String(s);
    if (width - length > static_cast<int64_t>(kMaxStringBytes)) {
      return TooLarge();
    }
    const std::string zeros(static_cast<size_t>(width - length), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
      return Value::String(s.substr(0, 1) + zeros + s.substr(1));
    }
    return Value::String(zeros + s);
  }
  if (name == "partition" || name == "rpartition") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"sep"}));
    ASSIGN_OR_RETURN(std::string sep, string_arg(p.Get(0, Value::Undefined())));
    if (sep.empty()) return absl::InvalidArgumentError("empty separator");
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition"
                 ? Value::Tuple(
                       {Value::String(s), Value::String(""), Value::String("")})
                 : Value::Tuple({Value::String(""), Value::String(""),
                                 Value::String(s)});
    }
    return Value::Tuple({Value::String(s.substr(0, at)), Value::String(sep),
                         Value::String(s.substr(at + sep.size()))});
  }
  return Unsupported("method", fn);
}

absl::StatusOr<Value> DictMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args) {
  const Dict& d = receiver.as_dict();
  const std::string fn = absl::StrCat("dict.", name);
  if (name == "get") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"key", "default"}));
    const Value* found = d.Find(p.Get(0, Value::Undefined()));
    return found != nullptr ? *found : p.Get(1);
  }
  if (name == "items" || name == "keys" || name == "values") {
    RETURN_IF_ERROR(Params::Bind(fn, args, {}).status());
    ValueList items;
    for (const Dict::Entry& e : d.entries()) {
      if (name == "items") {
        items.push_back(Value::Tuple({e.first, e.second}));
      } else {
        items.push_back(name == "keys" ? e.first : e.second);
      }
    }
    const ListFlavor flavor = name == "items"  ? ListFlavor::kDictItems
                              : name == "keys" ? ListFlavor::kDictKeys
                                               : ListFlavor::kDictValues;
    return Value::List(std::move(items), flavor);
  }
  if (name == "copy") {
    RETURN_IF_ERROR(Params::Bind(fn, args, {}).status());
    return receiver;
  }
  return Unsupported("method", fn);
}

absl::StatusOr<Value> ListMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args) {
  const ValueList& items = receiver.as_list();
  const std::string fn = absl::StrCat(TypeName(receiver), ".", name);
  if (name == "count" || name == "index") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"value"}));
    const Value needle = p.Get(0, Value::Undefined());
    int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!Equals(items[i], needle)) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") {
      absl::StatusOr<std::string> repr = ToPyRepr(needle);
      return absl::InvalidArgumentError(absl::StrCat(
          repr.ok() ? *repr : TypeName(needle), " is not in list"));
    }
    return Value::Int(n);
  }
  if (name == "copy") {
    RETURN_IF_ERROR(Params::Bind(fn, args, {}).status());
    return Value::List(items);
  }
  return Unsupported("method", fn);
}

Value BoundMethod(const Value& receiver, absl::string_view name) {
  auto fn = std::make_shared<Callable>();
  fn->name = absl::StrCat(TypeName(receiver), ".", name);
  fn->fn = [receiver, method = std::string(name)](CallArgs args) {
    return CallMethod(receiver, method, args);
  };
  return Value::Function(std::move(fn));
}

Value UnsafeAttribute(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat("access to attribute '", name, "' of '",
                                       TypeName(obj), "' object is unsafe."));
}

Value NoAttribute(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat(
      "'", TypeName(obj), " object' has no attribute '", name, "'"));
}

// --- Arithmetic
// ---------------------------------------------------------------

absl::Status OperandError(absl::string_view op, const Value& a,
                          const Value& b) {
  if (op == "+" && a.is_string()) {
    return TypeError(absl::StrCat("can only concatenate str (not \"",
                                  TypeName(b), "\") to str"));
  }
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                TypeName(a), "' and '", TypeName(b), "'"));
}

// Caps on what one operation may build, so that a template doubling a string
// or list in a loop stops with an error instead of exhausting memory.
constexpr size_t kMaxListItems = size_t{1} << 20;

absl::Status Overflow() {
  return absl::OutOfRangeError("integer overflow (beyond 64 bits)");
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t times) {
  times = std::max<int64_t>(times, 0);
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (times > 0 && s.size() > kMaxStringBytes / static_cast<size_t>(times)) {
      return TooLarge();
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::String(std::move(out));
  }
  const ValueList& items = seq.as_list();
  if (times > 0 && items.size() > kMaxListItems / static_cast<size_t>(times)) {
    return TooLarge();
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), items.begin(), items.end());
  }
  return Value::List(std::move(out), seq.flavor());
}

double PyFloatMod(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double PyFloatFloorDiv(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0.0) return std::copysign(0.0, a / b);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

absl::StatusOr<Value> NumericOp(absl::string_view op, const Value& a,
                                const Value& b) {
  const bool use_float = a.is_float() || b.is_float();
  if (op == "/") {
    const double y = b.as_double();
    if (y == 0.0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.as_double() / y);
  }
  if (use_float) {
    const double x = a.as_double();
    const double y = b.as_double();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "//" || op == "%") {
      if (y == 0.0) {
        return absl::InvalidArgumentError(
            op == "%" ? "float modulo" : "float floor division by zero");
      }
      return Value::Float(op == "%" ? PyFloatMod(x, y) : PyFloatFloorDiv(x, y));
    }
    if (op == "**") {
      if (x == 0.0 && y < 0) {
        return absl::InvalidArgumentError(
            "0.0 cannot be raised to a negative power");
      }
      if (x < 0 && y != std::floor(y)) {
        return Unsupported("operation", "complex power");
      }
      return Value::Float(std::pow(x, y));
    }
  } else {
    const int64_t x = a.as_integer();
    const int64_t y = b.as_integer();
    int64_t r = 0;
    if (op == "+") {
      if (__builtin_add_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    }
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    }
    if (op == "//" || op == "%") {
      if (y == 0) {
        return absl::InvalidArgumentError("integer division or modulo by zero");
      }
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value::Int(0);
        return Overflow();
      }
      int64_t q = x / y;
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::Int(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) {
        if (x == 0) {
          return absl::InvalidArgumentError(
              "0.0 cannot be raised to a negative power");
        }
        return Value::Float(
            std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
      int64_t result = 1;
      int64_t base = x;
      int64_t e = y;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return Overflow();
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base))
          return Overflow();
      }
      return Value::Int(result);
    }
  }
  return OperandError(op, a, b);
}

// --- Filters
// -------------------------------------------------------------------

absl::StatusOr<Value> MapFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
  ValueList out;
  if (args.args.empty()) {
    Value attribute;
    Value fallback = Value::None();
    bool has_attribute = false;
    for (const auto& [key, value] : args.kwargs) {
      if (key == "attribute") {
        attribute = value;
        has_attribute = true;
      } else if (key == "default") {
        fallback = value;
      } else {
        return TypeError(
            absl::StrCat("Unexpected keyword argument '", key, "'"));
      }
    }
    if (!has_attribute) {
      return TypeError("map requires a filter argument");
    }
    const ValueList parts = AttributeParts(attribute);
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, FollowPath(item, parts));
      if (v.is_undefined() && !fallback.is_none()) v = fallback;
      out.push_back(std::move(v));
    }
    return Value::List(std::move(out), ListFlavor::kIterator);
  }
  if (!args.args[0].is_string()) return TypeError("map requires a filter name");
  const std::string filter = args.args[0].as_string();
  if (!IsJinjaFilter(filter)) {
    return absl::InvalidArgumentError(
        absl::StrCat("No filter named '", filter, "'."));
  }
  CallArgs rest;
  rest.args.assign(args.args.begin() + 1, args.args.end());
  rest.kwargs = args.kwargs;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out), ListFlavor::kIterator);
}

// select, reject, selectattr, rejectattr.
absl::StatusOr<Value> SelectFilter(const Value& operand, const CallArgs& args,
                                   bool by_attribute, bool keep_when) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
  size_t next = 0;
  ValueList parts;
  if (by_attribute) {
    if (args.args.empty()) {
      return TypeError("Missing parameter for attribute name");
    }
    parts = AttributeParts(args.args[0]);
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.args.size()) {
    if (!args.args[next].is_string())
      return TypeError("test name must be a string");
    test = args.args[next].as_string();
    if (!IsJinjaTest(test)) {
      return absl::InvalidArgumentError(
          absl::StrCat("No test named '", test, "'."));
    }
    test_args.args.assign(args.args.begin() + next + 1, args.args.end());
    test_args.kwargs = args.kwargs;
  }
  ValueList out;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value subject, FollowPath(item, parts));
    bool passed;
    if (test.empty()) {
      passed = Truthy(subject);
    } else {
      ASSIGN_OR_RETURN(passed, ApplyTest(test, subject, test_args));
    }
    if (passed == keep_when) out.push_back(item);
  }
  return Value::List(std::move(out), ListFlavor::kIterator);
}

absl::StatusOr<Value> SortFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(
      Params p,
      Params::Bind("sort", args, {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = Truthy(p.Get(0, Value::Bool(false)));
  const bool case_sensitive = Truthy(p.Get(1, Value::Bool(false)));
  const Value attribute = p.Get(2);
  std::vector<ValueList> key_parts;
  if (attribute.is_string()) {
    for (const std::string& part : SplitSep(attribute.as_string(), ",", -1)) {
      key_parts.push_back(AttributeParts(Value::String(part)));
    }
  } else {
    key_parts.push_back(AttributeParts(attribute));
  }
  ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
  std::vector<std::pair<Value, Value>> keyed;  // (key list, item)
  for (const Value& item : items) {
    ValueList key;
    for (const ValueList& parts : key_parts) {
      ASSIGN_OR_RETURN(Value k, FollowPath(item, parts));
      key.push_back(case_sensitive ? k : IgnoreCase(k));
    }
    keyed.emplace_back(Value::List(std::move(key)), item);
  }
  absl::Status status;
  std::stable_sort(
      keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        absl::StatusOr<int> c =
            reverse ? Compare(b.first, a.first) : Compare(a.first, b.first);
        if (!c.ok()) {
          status = c.status();
          return false;
        }
        return *c < 0;
      });
  RETURN_IF_ERROR(status);
  ValueList out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MinMaxFilter(const Value& operand, const CallArgs& args,
                                   bool want_max) {
  ASSIGN_OR_RETURN(Params p, Params::Bind(want_max ? "max" : "min", args,
                                          {"case_sensitive", "attribute"}));
  const bool case_sensitive = Truthy(p.Get(0, Value::Bool(false)));
  const ValueList parts = AttributeParts(p.Get(1));
  ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
  if (items.empty()) {
    return Value::Undefined("No aggregated item, sequence was empty.");
  }
  size_t best = 0;
  ASSIGN_OR_RETURN(Value best_key, FollowPath(items[0], parts));
  if (!case_sensitive) best_key = IgnoreCase(best_key);
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value key, FollowPath(items[i], parts));
    if (!case_sensitive) key = IgnoreCase(key);
    ASSIGN_OR_RETURN(int c, Compare(key, best_key));
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

absl::StatusOr<Value> TojsonFilter(const Value& operand, const CallArgs& args) {
  // transformers' override: tojson(x, ensure_ascii=False, indent=None,
  // separators=None, sort_keys=False), i.e. json.dumps without HTML escaping.
  ASSIGN_OR_RETURN(Params p, Params::Bind("tojson", args,
                                          {"ensure_ascii", "indent",
                                           "separators", "sort_keys"}));
  JsonOptions options;
  options.ensure_ascii = Truthy(p.Get(0, Value::Bool(false)));
  const Value indent = p.Get(1);
  if (indent.is_int() || indent.is_bool()) {
    options.indent_set = true;
    options.indent = std::string(
        static_cast<size_t>(std::max<int64_t>(0, indent.as_integer())), ' ');
  } else if (indent.is_string()) {
    options.indent_set = true;
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    return TypeError(absl::StrCat(
        "tojson: indent must be an int or a str, not ", TypeName(indent)));
  }
  const Value separators = p.Get(2);
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.as_list().size() != 2 ||
        !separators.as_list()[0].is_string() ||
        !separators.as_list()[1].is_string()) {
      return TypeError("tojson: separators must be a pair of strings");
    }
    options.separators_set = true;
    options.item_separator = separators.as_list()[0].as_string();
    options.key_separator = separators.as_list()[1].as_string();
  }
  options.sort_keys = Truthy(p.Get(3, Value::Bool(false)));
  ASSIGN_OR_RETURN(std::string json, ToJson(operand, options));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> IndentFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(Params p,
                   Params::Bind("indent", args, {"width", "first", "blank"}));
  if (!operand.is_string()) {
    if (operand.is_undefined()) return UndefinedError(operand);
    return OperandError("+", operand, Value::String(""));
  }
  const Value width = p.Get(0, Value::Int(4));
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else {
    ASSIGN_OR_RETURN(int64_t n, ToIndex(width, "width"));
    if (n > static_cast<int64_t>(kMaxStringBytes)) return TooLarge();
    indention = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  }
  const bool first = Truthy(p.Get(1, Value::Bool(false)));
  const bool blank = Truthy(p.Get(2, Value::Bool(false)));
  // Jinja appends a newline so that splitlines keeps a trailing empty line.
  const std::vector<std::string> lines =
      PySplitLines(operand.as_string() + "\n");
  std::string rv;
  if (!lines.empty()) {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (blank || !lines[i].empty()) rv += indention;
      rv += lines[i];
      RETURN_IF_ERROR(CheckSize(rv));
    }
  }
  if (first) rv = indention + rv;
  RETURN_IF_ERROR(CheckSize(rv));
  return Value::String(std::move(rv));
}

// Python's int(text, base) for a str: optional sign, digits of the base
// with single underscores between them ("1_000"); surrounding whitespace was
// stripped by the caller.
std::optional<int64_t> PyIntFromString(absl::string_view text, int base) {
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    negative = text[i] == '-';
    ++i;
  }
  if (base == 16 && text.size() >= i + 2 && text[i] == '0' &&
      (text[i + 1] == 'x' || text[i + 1] == 'X')) {
    i += 2;
  }
  std::string digits;
  bool last_underscore = true;  // no leading underscore
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (last_underscore) return std::nullopt;
      last_underscore = true;
      continue;
    }
    const int d = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'a' && c <= 'z') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'Z') ? c - 'A' + 10
                                           : 99;
    if (d >= base) return std::nullopt;
    digits.push_back(c);
    last_underscore = false;
  }
  if (digits.empty() || last_underscore) return std::nullopt;
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return std::nullopt;
  if (negative) {
    if (v > static_cast<unsigned long long>(INT64_MAX) + 1) return std::nullopt;
    return static_cast<int64_t>(0 - v);
  }
  if (v > static_cast<unsigned long long>(INT64_MAX)) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Python's float(text): decimal or exponent notation with underscores between
// digits, or inf/infinity/nan; surrounding whitespace stripped by the caller.
std::optional<double> PyFloatFromString(absl::string_view text) {
  std::string clean;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= text.size() || !IsAsciiDigit(text[i - 1]) ||
          !IsAsciiDigit(text[i + 1])) {
        return std::nullopt;
      }
      continue;
    }
    clean.push_back(c);
  }
  std::string lower = PyLower(clean);
  absl::string_view body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-'))
    body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() ||
      body.find_first_not_of("0123456789.e+-") != absl::string_view::npos) {
    return std::nullopt;
  }
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end == clean.c_str() || *end != '\0') return std::nullopt;
  return v;
}

absl::StatusOr<Value> IntFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(Params p, Params::Bind("int", args, {"default", "base"}));
  const Value fallback = p.Get(0, Value::Int(0));
  if (operand.is_int() || operand.is_bool()) {
    return Value::Int(operand.as_integer());
  }
  if (operand.is_float()) {
    const double f = operand.as_float();
    if (std::isnan(f)) return fallback;
    if (std::isinf(f) || std::fabs(f) >= 9.2e18) return Overflow();
    return Value::Int(static_cast<int64_t>(std::trunc(f)));
  }
  if (operand.is_string()) {
    ASSIGN_OR_RETURN(int64_t base, ToIndex(p.Get(1, Value::Int(10)), "base"));
    const std::string text = PyStrip(operand.as_string(), nullptr, true, true);
    if (base >= 2 && base <= 36) {
      if (std::optional<int64_t> v =
              PyIntFromString(text, static_cast<int>(base))) {
        return Value::Int(*v);
      }
    }
    // Jinja retries as int(float(value)).
    if (std::optional<double> f = PyFloatFromString(text)) {
      if (std::isnan(*f)) return fallback;
      if (std::isinf(*f) || std::fabs(*f) >= 9.2e18) return Overflow();
      return Value::Int(static_cast<int64_t>(std::trunc(*f)));
    }
  }
  return fallback;
}

absl::StatusOr<Value> FloatFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(Params p, Params::Bind("float", args, {"default"}));
  if (operand.is_number()) return Value::Float(operand.as_double());
  if (operand.is_string()) {
    if (std::optional<double> f = PyFloatFromString(
            PyStrip(operand.as_string(), nullptr, true, true))) {
      return Value::Float(*f);
    }
  }
  return p.Get(0, Value::Float(0.0));
}

absl::StatusOr<Value> RoundFilter(const Value& operand, const CallArgs& args) {
  ASSIGN_OR_RETURN(Params p,
                   Params::Bind("round", args, {"precision", "method"}));
  ASSIGN_OR_RETURN(int64_t precision,
                   ToIndex(p.Get(0, Value::Int(0)), "precision"));
  const Value method = p.Get(1, Value::String("common"));
  if (!operand.is_number()) {
    if (operand.is_undefined()) return UndefinedError(operand);
    return TypeError(absl::StrCat("type ", TypeName(operand),
                                  " doesn't define __round__ method"));
  }
  if (!method.is_string() ||
      (method.as_string() != "common" && method.as_string() != "ceil" &&
       method.as_string() != "floor")) {
    return TypeError("method must be common, ceil or floor");
  }
  if (method.as_string() == "common") {
    // Python's round(x, n): an int stays an int; a float is rounded
    // correctly from its exact binary value (ties to even), as printf does.
    if (!operand.is_float()) {
      if (precision >= 0) return Value::Int(operand.as_integer());
      return Unsupported("filter", "round with negative precision");
    }
    const double x = operand.as_float();
    if (!std::isfinite(x)) return Value::Float(x);
    if (precision < 0 || precision > 300) {
      return Unsupported("filter", "round precision outside 0..300");
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    return Value::Float(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = operand.as_double() * scale;
  const double r =
      method.as_string() == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::Float(r / scale);
}

// Jinja's title filter: each run of characters between [-\s({\[<] gets its
// first character uppercased and the rest lowercased (not str.title()).
std::string JinjaTitle(absl::string_view s) {
  const std::u32string text = DecodeUtf8(s);
  std::string out;
  bool at_word_start = true;
  for (char32_t c : text) {
    const bool delimiter = IsPySpace(c) || c == '-' || c == '(' || c == '{' ||
                           c == '[' || c == '<';
    std::string one;
    AppendUtf8(c, &one);
    if (delimiter) {
      out += one;
      at_word_start = true;
    } else {
      out += at_word_start ? PyUpper(one) : PyLower(one);
      at_word_start = false;
    }
  }
  return out;
}

}  // namespace

bool IsJinjaFilter(absl::string_view name) {
  return JinjaFilters().contains(name);
}

bool IsJinjaTest(absl::string_view name) { return JinjaTests().contains(name); }

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(undefined.undefined_hint().empty()
                                        ? "value is undefined"
                                        : undefined.undefined_hint());
}

Value GetAttr(const Value& obj, absl::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      if (IsDictMethod(name)) return BoundMethod(obj, name);
      if (IsMutatingDictMethod(name)) return UnsafeAttribute(obj, name);
      const Value* found = obj.as_dict().Find(name);
      if (found != nullptr) return *found;
      return NoAttribute(obj, name);
    }
    case Value::Kind::kNamespace: {
      const Value* found = obj.namespace_attrs().Find(name);
      if (found != nullptr) return *found;
      return NoAttribute(obj, name);
    }
    case Value::Kind::kString:
      if (StrMethods().contains(name)) return BoundMethod(obj, name);
      return NoAttribute(obj, name);
    case Value::Kind::kList:
      if (obj.flavor() == ListFlavor::kList ||
          obj.flavor() == ListFlavor::kTuple) {
        if (IsListMethod(name) &&
            (obj.flavor() == ListFlavor::kList || name != "copy")) {
          return BoundMethod(obj, name);
        }
        if (obj.flavor() == ListFlavor::kList && IsMutatingListMethod(name)) {
          return UnsafeAttribute(obj, name);
        }
      }
      return NoAttribute(obj, name);
    default:
      return NoAttribute(obj, name);
  }
}

Value GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      const Value* found = obj.as_dict().Find(key);
      if (found != nullptr) return *found;
      break;
    }
    case Value::Kind::kList:
      if ((obj.flavor() == ListFlavor::kList ||
           obj.flavor() == ListFlavor::kTuple) &&
          (key.is_int() || key.is_bool())) {
        const ValueList& items = obj.as_list();
        int64_t i = key.as_integer();
        const int64_t n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        return Value::Undefined(
            absl::StrCat("list object has no element ", key.as_integer()));
      }
      break;
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const std::u32string text = DecodeUtf8(obj.as_string());
        int64_t i = key.as_integer();
        const int64_t n = static_cast<int64_t>(text.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string one;
          AppendUtf8(text[static_cast<size_t>(i)], &one);
          return Value::String(std::move(one));
        }
        return Value::Undefined(
            absl::StrCat("str object has no element ", key.as_integer()));
      }
      break;
    default:
      break;
  }
  // The sandbox falls back to the attribute for string keys.
  if (key.is_string()) return GetAttr(obj, key.as_string());
  absl::StatusOr<std::string> repr = ToPyRepr(key);
  return Value::Undefined(absl::StrCat("'", TypeName(obj),
                                       " object' has no attribute ",
                                       repr.ok() ? *repr : TypeName(key)));
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start,
                               const Value& stop, const Value& step) {
  const bool sliceable =
      obj.is_string() ||
      (obj.is_list() && (obj.flavor() == ListFlavor::kList ||
                         obj.flavor() == ListFlavor::kTuple));
  auto is_index = [](const Value& v) {
    return v.is_none() || v.is_int() || v.is_bool();
  };
  if (!sliceable || !is_index(start) || !is_index(stop) || !is_index(step)) {
    // TypeError inside the sandbox's getitem becomes Undefined.
    return Value::Undefined(
        absl::StrCat("'", TypeName(obj), "' object cannot be sliced"));
  }
  const int64_t step_value = step.is_none() ? 1 : step.as_integer();
  if (step_value == 0) {
    return absl::InvalidArgumentError("slice step cannot be zero");
  }
  const std::u32string text =
      obj.is_string() ? DecodeUtf8(obj.as_string()) : std::u32string();
  const int64_t length = obj.is_string()
                             ? static_cast<int64_t>(text.size())
                             : static_cast<int64_t>(obj.as_list().size());
  const bool positive = step_value > 0;
  int64_t begin = start.is_none()
                      ? (positive ? 0 : length - 1)
                      : ClampIndex(start.as_integer(), length, positive);
  int64_t end = stop.is_none()
                    ? (positive ? length : -1)
                    : ClampIndex(stop.as_integer(), length, positive);
  std::vector<int64_t> indices;
  for (int64_t i = begin; positive ? i < end : i > end; i += step_value) {
    indices.push_back(i);
  }
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : indices) out.push_back(text[static_cast<size_t>(i)]);
    return Value::String(EncodeUtf8(out));
  }
  ValueList out;
  for (int64_t i : indices)
    out.push_back(obj.as_list()[static_cast<size_t>(i)]);
  return Value::List(std::move(out), obj.flavor());
}

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a,
                               const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) return NumericOp(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        // Markup.__add__/__radd__ escape the plain operand.
        std::string left = a.as_string();
        if (!a.is_markup()) {
          ASSIGN_OR_RETURN(left, HtmlEscape(a.as_string()));
        }
        std::string right = b.as_string();
        if (!b.is_markup()) {
          ASSIGN_OR_RETURN(right, HtmlEscape(b.as_string()));
        }
        if (left.size() + right.size() > kMaxStringBytes) return TooLarge();
        return Value::String(left + right, /*markup=*/true);
      }
      if (a.as_string().size() + b.as_string().size() > kMaxStringBytes) {
        return TooLarge();
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.flavor() == b.flavor() &&
        (a.flavor() == ListFlavor::kList || a.flavor() == ListFlavor::kTuple)) {
      if (a.as_list().size() + b.as_list().size() > kMaxListItems) {
        return TooLarge();
      }
      ValueList items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::List(std::move(items), a.flavor());
    }
  }
  if (op == "*") {
    auto sequence = [](const Value& v) {
      return v.is_string() ||
             (v.is_list() && (v.flavor() == ListFlavor::kList ||
                              v.flavor() == ListFlavor::kTuple));
    };
    auto integer = [](const Value& v) { return v.is_int() || v.is_bool(); };
    if (sequence(a) && integer(b)) return Repeat(a, b.as_integer());
    if (integer(a) && sequence(b)) return Repeat(b, a.as_integer());
  }
  if (op == "%" && a.is_string()) {
    return Unsupported("operation", "printf-style string formatting (%)");
  }
  return OperandError(op, a, b);
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) return UndefinedError(item);
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ",
                         TypeName(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.as_dict().Find(item) != nullptr;
    default:
      return TypeError(absl::StrCat("argument of type '", TypeName(container),
                                    "' is not iterable"));
  }
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList();
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict:
      return DictKeys(v.as_dict());
    case Value::Kind::kString:
      return CharsList(v.as_string()).as_list();
    default:
      return TypeError(
          absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand,
                                  const CallArgs& args) {
  const std::string fn(name);
  auto no_args = [&]() { return Params::Bind(fn, args, {}).status(); };

  if (name == "tojson") return TojsonFilter(operand, args);
  if (name == "trim") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"chars"}));
    const Value chars = p.Get(0);
    if (!chars.is_none() && !chars.is_string()) {
      return TypeError("strip arg must be None or str");
    }
    std::string set = chars.is_string() ? chars.as_string() : "";
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(
        PyStrip(text, chars.is_none() ? nullptr : &set, true, true));
  }
  if (name == "length" || name == "count") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(int64_t n, Len(operand));
    return Value::Int(n);
  }
  if (name == "lower") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(PyLower(text));
  }
  if (name == "upper") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(PyUpper(text));
  }
  if (name == "title") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(JinjaTitle(text));
  }
  if (name == "capitalize") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(PyCapitalize(text));
  }
  if (name == "string") {
    RETURN_IF_ERROR(no_args());
    if (operand.is_string()) return operand;
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(std::move(text));
  }
  if (name == "int") return IntFilter(operand, args);
  if (name == "float") return FloatFilter(operand, args);
  if (name == "round") return RoundFilter(operand, args);
  if (name == "abs") {
    RETURN_IF_ERROR(no_args());
    if (operand.is_float()) return Value::Float(std::fabs(operand.as_float()));
    if (operand.is_int() || operand.is_bool()) {
      const int64_t i = operand.as_integer();
      if (i == INT64_MIN) return Overflow();
      return Value::Int(i < 0 ? -i : i);
    }
    if (operand.is_undefined()) return UndefinedError(operand);
    return TypeError(
        absl::StrCat("bad operand type for abs(): '", TypeName(operand), "'"));
  }
  if (name == "default" || name == "d") {
    ASSIGN_OR_RETURN(Params p,
                     Params::Bind(fn, args, {"default_value", "boolean"}));
    const bool boolean = Truthy(p.Get(1, Value::Bool(false)));
    if (operand.is_undefined() || (boolean && !Truthy(operand))) {
      return p.Get(0, Value::String(""));
    }
    return operand;
  }
  if (name == "first" || name == "last") {
    RETURN_IF_ERROR(no_args());
    if (name == "last" && operand.is_list() &&
        operand.flavor() == ListFlavor::kIterator) {
      return TypeError("'generator' object is not reversible");
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    if (items.empty()) {
      return Value::Undefined(
          absl::StrCat("No ", name, " item, sequence was empty."));
    }
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"d", "attribute"}));
    ASSIGN_OR_RETURN(const std::string separator,
                     ToPyStr(p.Get(0, Value::String(""))));
    const ValueList parts = AttributeParts(p.Get(1));
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      ASSIGN_OR_RETURN(Value item, FollowPath(items[i], parts));
      if (i > 0) out += separator;
      if (item.is_string()) {
        out += item.as_string();
      } else {
        ASSIGN_OR_RETURN(std::string text, ToPyStr(item));
        out += text;
      }
      RETURN_IF_ERROR(CheckSize(out));
    }
    return Value::String(std::move(out));
  }
  if (name == "list") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    RETURN_IF_ERROR(no_args());
    if (operand.is_undefined()) return Value::List({}, ListFlavor::kIterator);
    if (!operand.is_dict()) {
      return TypeError("Can only get item pairs from a mapping.");
    }
    ValueList items;
    for (const Dict::Entry& e : operand.as_dict().entries()) {
      items.push_back(Value::Tuple({e.first, e.second}));
    }
    return Value::List(std::move(items), ListFlavor::kIterator);
  }
  if (name == "reverse") {
    RETURN_IF_ERROR(no_args());
    if (operand.is_string()) {
      std::u32string text = DecodeUtf8(operand.as_string());
      std::reverse(text.begin(), text.end());
      return Value::String(EncodeUtf8(text));
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    std::reverse(items.begin(), items.end());
    // reversed() of a sequence is an iterator; a generator becomes a list.
    const bool was_generator =
        operand.is_list() && operand.flavor() == ListFlavor::kIterator;
    return Value::List(std::move(items), was_generator ? ListFlavor::kList
                                                       : ListFlavor::kIterator);
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"old", "new", "count"}));
    int64_t count = -1;
    if (p.Has(2) && !p.Get(2).is_none()) {
      ASSIGN_OR_RETURN(count, ToIndex(p.Get(2), "count"));
    }
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    ASSIGN_OR_RETURN(std::string old, ToPyStr(p.Get(0, Value::Undefined())));
    ASSIGN_OR_RETURN(std::string replacement,
                     ToPyStr(p.Get(1, Value::Undefined())));
    ASSIGN_OR_RETURN(std::string replaced,
                     Replace(text, old, replacement, count));
    return Value::String(std::move(replaced));
  }
  if (name == "map") return MapFilter(operand, args);
  if (name == "select") return SelectFilter(operand, args, false, true);
  if (name == "reject") return SelectFilter(operand, args, false, false);
  if (name == "selectattr") return SelectFilter(operand, args, true, true);
  if (name == "rejectattr") return SelectFilter(operand, args, true, false);
  if (name == "sort") return SortFilter(operand, args);
  if (name == "max") return MinMaxFilter(operand, args, true);
  if (name == "min") return MinMaxFilter(operand, args, false);
  if (name == "unique") {
    ASSIGN_OR_RETURN(Params p,
                     Params::Bind(fn, args, {"case_sensitive", "attribute"}));
    const bool case_sensitive = Truthy(p.Get(0, Value::Bool(false)));
    const ValueList parts = AttributeParts(p.Get(1));
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    ValueList seen;
    ValueList out;
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value key, FollowPath(item, parts));
      if (!case_sensitive) key = IgnoreCase(key);
      if (std::any_of(seen.begin(), seen.end(),
                      [&](const Value& s) { return Equals(s, key); })) {
        continue;
      }
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::List(std::move(out), ListFlavor::kIterator);
  }
  if (name == "sum") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"attribute", "start"}));
    const ValueList parts = AttributeParts(p.Get(0));
    Value total = p.Get(1, Value::Int(0));
    ASSIGN_OR_RETURN(ValueList items, Iterate(operand));
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, FollowPath(item, parts));
      ASSIGN_OR_RETURN(total, BinaryOp("+", total, v));
    }
    return total;
  }
  if (name == "dictsort") {
    ASSIGN_OR_RETURN(
        Params p, Params::Bind(fn, args, {"case_sensitive", "by", "reverse"}));
    if (!operand.is_dict()) {
      if (operand.is_undefined()) return UndefinedError(operand);
      return TypeError(absl::StrCat("'", TypeName(operand),
                                    "' object has no attribute 'items'"));
    }
    const bool case_sensitive = Truthy(p.Get(0, Value::Bool(false)));
    const Value by = p.Get(1, Value::String("key"));
    if (!by.is_string() ||
        (by.as_string() != "key" && by.as_string() != "value")) {
      return TypeError("You can only sort by either \"key\" or \"value\"");
    }
    const size_t pos = by.as_string() == "key" ? 0 : 1;
    CallArgs sort_args;
    sort_args.kwargs.emplace_back("reverse", p.Get(2, Value::Bool(false)));
    sort_args.kwargs.emplace_back("case_sensitive",
                                  Value::Bool(case_sensitive));
    sort_args.kwargs.emplace_back("attribute",
                                  Value::Int(static_cast<int64_t>(pos)));
    ValueList pairs;
    for (const Dict::Entry& e : operand.as_dict().entries()) {
      pairs.push_back(Value::Tuple({e.first, e.second}));
    }
    return SortFilter(Value::List(std::move(pairs)), sort_args);
  }
  if (name == "attr") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"name"}));
    const Value attr = p.Get(0, Value::Undefined());
    if (operand.is_undefined()) return UndefinedError(operand);
    if (!attr.is_string()) return TypeError("attribute name must be a string");
    return GetAttr(operand, attr.as_string());
  }
  if (name == "safe") {
    RETURN_IF_ERROR(no_args());
    if (operand.is_string()) return Value::String(operand.as_string(), true);
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    return Value::String(std::move(text), /*markup=*/true);
  }
  if (name == "escape" || name == "e") {
    RETURN_IF_ERROR(no_args());
    return Escape(operand);
  }
  if (name == "forceescape") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    ASSIGN_OR_RETURN(std::string escaped, HtmlEscape(text));
    return Value::String(std::move(escaped), /*markup=*/true);
  }
  if (name == "indent") return IndentFilter(operand, args);
  if (name == "center") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"width"}));
    ASSIGN_OR_RETURN(int64_t width, ToIndex(p.Get(0, Value::Int(80)), "width"));
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    ASSIGN_OR_RETURN(std::string padded, Pad(text, width, U' ', "center"));
    return Value::String(std::move(padded));
  }
  if (name == "wordcount") {
    RETURN_IF_ERROR(no_args());
    int64_t words = 0;
    bool in_word = false;
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    for (char32_t c : DecodeUtf8(text)) {
      const bool w = IsWordChar(c);
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::Int(words);
  }
  return Unsupported("filter", name);
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& operand,
                               const CallArgs& args) {
  const std::string fn(name);
  auto no_args = [&]() { return Params::Bind(fn, args, {}).status(); };
  auto one_arg = [&]() -> absl::StatusOr<Value> {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {"other"}));
    if (!p.Has(0)) {
      return TypeError(absl::StrCat(name, "() missing 1 required argument"));
    }
    return p.Get(0);
  };

  if (name == "defined" || name == "undefined") {
    RETURN_IF_ERROR(no_args());
    return operand.is_undefined() == (name == "undefined");
  }
  if (name == "none") {
    RETURN_IF_ERROR(no_args());
    return operand.is_none();
  }
  if (name == "boolean" || name == "true" || name == "false") {
    RETURN_IF_ERROR(no_args());
    if (!operand.is_bool()) return false;
    return name == "boolean" || operand.as_bool() == (name == "true");
  }
  if (name == "integer") {
    RETURN_IF_ERROR(no_args());
    return operand.is_int();
  }
  if (name == "float") {
    RETURN_IF_ERROR(no_args());
    return operand.is_float();
  }
  if (name == "number") {
    RETURN_IF_ERROR(no_args());
    return operand.is_number();
  }
  if (name == "string") {
    RETURN_IF_ERROR(no_args());
    return operand.is_string();
  }
  if (name == "mapping") {
    RETURN_IF_ERROR(no_args());
    return operand.is_dict();
  }
  if (name == "iterable") {
    RETURN_IF_ERROR(no_args());
    return operand.is_undefined() || operand.is_string() || operand.is_list() ||
           operand.is_dict();
  }
  if (name == "sequence") {
    RETURN_IF_ERROR(no_args());
    // Has both __len__ and __getitem__ (Undefined has both).
    return operand.is_undefined() || operand.is_string() || operand.is_dict() ||
           (operand.is_list() && (operand.flavor() == ListFlavor::kList ||
                                  operand.flavor() == ListFlavor::kTuple));
  }
  if (name == "callable") {
    RETURN_IF_ERROR(no_args());
    return operand.is_callable() || operand.is_undefined();
  }
  if (name == "escaped") {
    RETURN_IF_ERROR(no_args());
    return operand.is_string() && operand.is_markup();
  }
  if (name == "lower" || name == "upper") {
    RETURN_IF_ERROR(no_args());
    ASSIGN_OR_RETURN(std::string text, ToPyStr(operand));
    ASSIGN_OR_RETURN(
        Value r,
        StringMethod(Value::String(std::move(text)),
                     name == "lower" ? "islower" : "isupper", CallArgs()));
    return r.as_bool();
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value divisor = Value::Int(2);
    if (name == "divisibleby") {
      ASSIGN_OR_RETURN(divisor, one_arg());
    } else {
      RETURN_IF_ERROR(no_args());
    }
    ASSIGN_OR_RETURN(Value rem, BinaryOp("%", operand, divisor));
    const bool zero = Equals(rem, Value::Int(0));
    return name == "odd" ? Equals(rem, Value::Int(1)) : zero;
  }
  if (name == "sameas") {
    ASSIGN_OR_RETURN(Value other, one_arg());
    if (operand.kind() != other.kind()) return false;
    if (operand.is_none() || operand.is_undefined()) return operand.is_none();
    if (operand.is_bool()) return operand.as_bool() == other.as_bool();
    if (operand.identity() != nullptr) {
      return operand.identity() == other.identity();
    }
    return Equals(operand, other);
  }
  if (name == "in") {
    ASSIGN_OR_RETURN(Value seq, one_arg());
    return Contains(seq, operand);
  }
  if (name == "==" || name == "eq" || name == "equalto") {
    ASSIGN_OR_RETURN(Value other, one_arg());
    return Equals(operand, other);
  }
  if (name == "!=" || name == "ne") {
    ASSIGN_OR_RETURN(Value other, one_arg());
    return !Equals(operand, other);
  }
  if (name == ">" || name == "gt" || name == "greaterthan" || name == ">=" ||
      name == "ge" || name == "<" || name == "lt" || name == "lessthan" ||
      name == "<=" || name == "le") {
    ASSIGN_OR_RETURN(Value other, one_arg());
    if (operand.is_undefined()) return UndefinedError(operand);
    ASSIGN_OR_RETURN(int c, Compare(operand, other));
    if (name == ">" || name == "gt" || name == "greaterthan") return c > 0;
    if (name == ">=" || name == "ge") return c >= 0;
    if (name == "<" || name == "lt" || name == "lessthan") return c < 0;
    return c <= 0;
  }
  if (name == "filter" || name == "test") {
    ASSIGN_OR_RETURN(Params p, Params::Bind(fn, args, {}));
    (void)p;
    if (!operand.is_string()) return false;
    return name == "filter" ? IsJinjaFilter(operand.as_string())
                            : IsJinjaTest(operand.as_string());
  }
  return Unsupported("test", name);
}

absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args) {
  switch (receiver.kind()) {
    case Value::Kind::kString:
      return StringMethod(receiver, name, args);
    case Value::Kind::kDict:
      return DictMethod(receiver, name, args);
    case Value::Kind::kList:
      return ListMethod(receiver, name, args);
    default:
      return Unsupported("method", absl::StrCat(TypeName(receiver), ".", name));
  }
}

}  // namespace jinja
}  // namespace tessera
