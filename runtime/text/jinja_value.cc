#include "runtime/text/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"
#include "runtime/text/jinja.h"
#include "utf8proc.h"

namespace tessera {
namespace jinja {

// --- Value ------------------------------------------------------------------

Value Value::Undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.data_ = std::make_shared<const std::string>(hint);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.data_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.data_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.data_ = f;
  return v;
}

Value Value::String(std::string s, bool markup) {
  Value v;
  v.kind_ = Kind::kString;
  v.markup_ = markup;
  v.data_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

namespace {

uint32_t DepthOf(const ValueList& items) {
  int deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.depth());
  return static_cast<uint32_t>(deepest) + 1;
}

uint32_t DepthOf(const Dict& dict) {
  int deepest = 0;
  for (const Dict::Entry& e : dict.entries()) {
    deepest = std::max({deepest, e.first.depth(), e.second.depth()});
  }
  return static_cast<uint32_t>(deepest) + 1;
}

}  // namespace

Value Value::List(ValueList items, ListFlavor flavor) {
  Value v;
  v.kind_ = Kind::kList;
  v.flavor_ = flavor;
  v.depth_ = DepthOf(items);
  v.data_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::FromDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = DepthOf(dict);
  v.data_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::NewNamespace(Dict attrs) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.depth_ = DepthOf(attrs);
  v.data_ = std::make_shared<Dict>(std::move(attrs));
  return v;
}

Value Value::Function(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.data_ = std::move(fn);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::kBool:
      return as_bool() ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(as_int());
    default:
      return as_float();
  }
}

int64_t Value::as_integer() const {
  return kind_ == Kind::kBool ? (as_bool() ? 1 : 0) : as_int();
}

const std::string& Value::undefined_hint() const {
  static const std::string* const kEmpty = new std::string();
  if (kind_ == Kind::kUndefined && std::holds_alternative<StrPtr>(data_)) {
    return *std::get<StrPtr>(data_);
  }
  return *kEmpty;
}

const void* Value::identity() const {
  switch (kind_) {
    case Kind::kList:
      return std::get<ListPtr>(data_).get();
    case Kind::kDict:
      return std::get<DictPtr>(data_).get();
    case Kind::kNamespace:
      return std::get<NsPtr>(data_).get();
    case Kind::kCallable:
      return std::get<FnPtr>(data_).get();
    default:
      return nullptr;
  }
}

// --- Dict -------------------------------------------------------------------

const Value* Dict::Find(const Value& key) const {
  for (const Entry& e : entries_) {
    if (Equals(e.first, key)) return &e.second;
  }
  return nullptr;
}

const Value* Dict::Find(absl::string_view key) const {
  for (const Entry& e : entries_) {
    if (e.first.is_string() && e.first.as_string() == key) return &e.second;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (Entry& e : entries_) {
    if (Equals(e.first, key)) {
      e.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// --- Python semantics -------------------------------------------------------

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      switch (v.flavor()) {
        case ListFlavor::kList:
          return "list";
        case ListFlavor::kTuple:
          return "tuple";
        case ListFlavor::kIterator:
          return "generator";
        case ListFlavor::kDictItems:
          return "dict_items";
        case ListFlavor::kDictKeys:
          return "dict_keys";
        case ListFlavor::kDictValues:
          return "dict_values";
      }
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      // A generator object has no __len__ or __bool__: always true.
      return v.flavor() == ListFlavor::kIterator || !v.as_list().empty();
    case Value::Kind::kDict:
      return !v.as_dict().empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

namespace {

// list == list and tuple == tuple compare by value; list == tuple is False.
bool IsSequenceFlavor(ListFlavor f) {
  return f == ListFlavor::kList || f == ListFlavor::kTuple;
}

}  // namespace

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_integer() == b.as_integer();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.identity() == b.identity()) return true;
      if (a.flavor() != b.flavor() || !IsSequenceFlavor(a.flavor())) {
        return false;
      }
      const ValueList& x = a.as_list();
      const ValueList& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const Dict::Entry& e : x.entries()) {
        const Value* other = y.Find(e.first);
        if (other == nullptr || !Equals(e.second, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

namespace {

absl::Status TooDeep() {
  return absl::InvalidArgumentError(
      absl::StrCat("value nested deeper than ", kMaxValueDepth, " levels"));
}

absl::Status TooLong() {
  return absl::InvalidArgumentError(
      absl::StrCat("string longer than ", kMaxStringBytes, " bytes"));
}

}  // namespace

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.depth() > kMaxValueDepth || b.depth() > kMaxValueDepth) {
    return TooDeep();
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double();
      const double y = b.as_double();
      return x < y ? -1 : (y < x ? 1 : 0);
    }
    const int64_t x = a.as_integer();
    const int64_t y = b.as_integer();
    return x < y ? -1 : (y < x ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is Python's str order.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.flavor() == b.flavor() &&
      IsSequenceFlavor(a.flavor())) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    return absl::InvalidArgumentError(
        u.undefined_hint().empty() ? "value is undefined" : u.undefined_hint());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' not supported between instances of '", TypeName(a),
                   "' and '", TypeName(b), "'"));
}

std::string PyFloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // The shortest %e precision that reads back exactly gives Python's digits.
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string text = buf;
  std::string sign;
  if (text[0] == '-') {
    sign = "-";
    text.erase(0, 1);
  }
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  // The value is 0.DIGITS * 10^decimal_point.
  const int decimal_point = exponent + 1;
  const int n = static_cast<int>(digits.size());
  std::string out = sign;
  if (decimal_point <= -4 || decimal_point > 16) {
    out += digits.substr(0, 1);
    if (n > 1) absl::StrAppend(&out, ".", digits.substr(1));
    const int exp10 = decimal_point - 1;
    absl::StrAppend(&out, absl::StrFormat("e%c%02d", exp10 < 0 ? '-' : '+',
                                          std::abs(exp10)));
  } else if (decimal_point <= 0) {
    absl::StrAppend(&out, "0.", std::string(-decimal_point, '0'), digits);
  } else if (decimal_point >= n) {
    absl::StrAppend(&out, digits, std::string(decimal_point - n, '0'), ".0");
  } else {
    absl::StrAppend(&out, digits.substr(0, decimal_point), ".",
                    digits.substr(decimal_point));
  }
  return out;
}

namespace {

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string PyStringRepr(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", static_cast<uint32_t>(c));
    } else if (c < 0x7f || IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xff) {
      out += absl::StrFormat("\\x%02x", static_cast<uint32_t>(c));
    } else if (c <= 0xffff) {
      out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
    } else {
      out += absl::StrFormat("\\U%08x", static_cast<uint32_t>(c));
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

// str() and repr() of nested values, bounded in depth and length. Python's
// repr of a dict that contains itself (through a namespace, the one mutable
// container) prints the inner occurrence as "{...}"; `active_` holds the
// namespaces being printed, as Python's Py_ReprEnter does.
class Printer {
 public:
  absl::Status Str(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return absl::OkStatus();
      case Value::Kind::kString:
        return Add(v.as_string());
      case Value::Kind::kList:
      case Value::Kind::kDict:
        return Repr(v, depth);
      case Value::Kind::kNamespace: {
        const Dict* attrs = &v.namespace_attrs();
        RETURN_IF_ERROR(Add("<Namespace "));
        if (std::find(active_.begin(), active_.end(), attrs) != active_.end()) {
          RETURN_IF_ERROR(Add("{...}"));
        } else {
          active_.push_back(attrs);
          absl::Status status = DictRepr(*attrs, depth);
          active_.pop_back();
          RETURN_IF_ERROR(status);
        }
        return Add(">");
      }
      default:
        return Add(Scalar(v));
    }
  }

  absl::Status Repr(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return Add("Undefined");
      case Value::Kind::kString:
        return Add(PyStringRepr(v.as_string()));
      case Value::Kind::kList: {
        const ValueList& items = v.as_list();
        switch (v.flavor()) {
          case ListFlavor::kList:
            RETURN_IF_ERROR(Add("["));
            RETURN_IF_ERROR(Items(items, depth));
            return Add("]");
          case ListFlavor::kTuple:
            RETURN_IF_ERROR(Add("("));
            RETURN_IF_ERROR(Items(items, depth));
            return Add(items.size() == 1 ? ",)" : ")");
          case ListFlavor::kIterator:
            return Add("<generator object>");
          case ListFlavor::kDictItems:
            RETURN_IF_ERROR(Add("dict_items(["));
            break;
          case ListFlavor::kDictKeys:
            RETURN_IF_ERROR(Add("dict_keys(["));
            break;
          case ListFlavor::kDictValues:
            RETURN_IF_ERROR(Add("dict_values(["));
            break;
        }
        RETURN_IF_ERROR(Items(items, depth));
        return Add("])");
      }
      case Value::Kind::kDict:
        return DictRepr(v.as_dict(), depth);
      default:
        return Str(v, depth);
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  static std::string Scalar(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        return "None";
      case Value::Kind::kBool:
        return v.as_bool() ? "True" : "False";
      case Value::Kind::kInt:
        return absl::StrCat(v.as_int());
      case Value::Kind::kFloat:
        return PyFloatRepr(v.as_float());
      case Value::Kind::kCallable:
        return absl::StrCat("<function ", v.as_callable().name, ">");
      default:
        return "";
    }
  }

  absl::Status Add(absl::string_view text) {
    if (out_.size() + text.size() > kMaxStringBytes) return TooLong();
    out_.append(text.data(), text.size());
    return absl::OkStatus();
  }

  // Entering a container: one level deeper.
  static absl::Status Enter(int depth) {
    if (depth >= kMaxValueDepth) return TooDeep();
    return absl::OkStatus();
  }

  absl::Status Items(const ValueList& items, int depth) {
    RETURN_IF_ERROR(Enter(depth));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) RETURN_IF_ERROR(Add(", "));
      RETURN_IF_ERROR(Repr(items[i], depth + 1));
    }
    return absl::OkStatus();
  }

  absl::Status DictRepr(const Dict& dict, int depth) {
    RETURN_IF_ERROR(Enter(depth));
    RETURN_IF_ERROR(Add("{"));
    bool first = true;
    for (const Dict::Entry& e : dict.entries()) {
      if (!first) RETURN_IF_ERROR(Add(", "));
      first = false;
      RETURN_IF_ERROR(Repr(e.first, depth + 1));
      RETURN_IF_ERROR(Add(": "));
      RETURN_IF_ERROR(Repr(e.second, depth + 1));
    }
    return Add("}");
  }

  std::string out_;
  std::vector<const Dict*> active_;
};

}  // namespace

absl::StatusOr<std::string> ToPyStr(const Value& v) {
  // Scalars, the common case, without the printer.
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::string();
    case Value::Kind::kString:
      return v.as_string();
    default:
      break;
  }
  Printer printer;
  RETURN_IF_ERROR(printer.Str(v, 0));
  return printer.Take();
}

absl::StatusOr<std::string> ToPyRepr(const Value& v) {
  Printer printer;
  RETURN_IF_ERROR(printer.Repr(v, 0));
  return printer.Take();
}

// --- JSON -------------------------------------------------------------------

namespace {

void AppendJsonString(absl::string_view s, bool ensure_ascii,
                      std::string* out) {
  out->push_back('"');
  for (char32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
      if (c > 0xffff) {
        const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
        *out += absl::StrFormat("\\u%04x\\u%04x", 0xd800 + (v >> 10),
                                0xdc00 + (v & 0x3ff));
      } else {
        *out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
      }
    } else {
      AppendUtf8(c, out);
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return PyFloatRepr(f);
}

absl::Status JsonTypeError(const Value& v) {
  if (v.is_undefined() && !v.undefined_hint().empty()) {
    return absl::InvalidArgumentError(v.undefined_hint());
  }
  return absl::InvalidArgumentError(absl::StrCat("Object of type ", TypeName(v),
                                                 " is not JSON serializable"));
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : options_(options) {
    if (options.separators_set) {
      item_sep_ = options.item_separator;
      key_sep_ = options.key_separator;
    } else {
      item_sep_ = options.indent_set ? "," : ", ";
      key_sep_ = ": ";
    }
  }

  absl::Status Write(const Value& v, int depth, std::string* out) {
    if (depth > kMaxValueDepth) return TooDeep();
    if (out->size() > kMaxStringBytes) return TooLong();
    switch (v.kind()) {
      case Value::Kind::kNone:
        *out += "null";
        return absl::OkStatus();
      case Value::Kind::kBool:
        *out += v.as_bool() ? "true" : "false";
        return absl::OkStatus();
      case Value::Kind::kInt:
        absl::StrAppend(out, v.as_int());
        return absl::OkStatus();
      case Value::Kind::kFloat:
        *out += JsonFloat(v.as_float());
        return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(v.as_string(), options_.ensure_ascii, out);
        return absl::OkStatus();
      case Value::Kind::kList: {
        if (!IsSequenceFlavor(v.flavor())) return JsonTypeError(v);
        const ValueList& items = v.as_list();
        if (items.empty()) {
          *out += "[]";
          return absl::OkStatus();
        }
        out->push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) *out += item_sep_;
          RETURN_IF_ERROR(NewLine(depth + 1, out));
          RETURN_IF_ERROR(Write(items[i], depth + 1, out));
        }
        RETURN_IF_ERROR(NewLine(depth, out));
        out->push_back(']');
        return absl::OkStatus();
      }
      case Value::Kind::kDict:
        return WriteDict(v.as_dict(), depth, out);
      default:
        return JsonTypeError(v);
    }
  }

 private:
  absl::Status NewLine(int depth, std::string* out) const {
    if (!options_.indent_set) return absl::OkStatus();
    if (out->size() + 1 + options_.indent.size() * static_cast<size_t>(depth) >
        kMaxStringBytes) {
      return TooLong();
    }
    out->push_back('\n');
    for (int i = 0; i < depth; ++i) *out += options_.indent;
    return absl::OkStatus();
  }

  static absl::StatusOr<std::string> KeyString(const Value& key,
                                               bool ensure_ascii) {
    std::string text;
    switch (key.kind()) {
      case Value::Kind::kString:
        text = key.as_string();
        break;
      case Value::Kind::kInt:
        text = absl::StrCat(key.as_int());
        break;
      case Value::Kind::kFloat:
        text = JsonFloat(key.as_float());
        break;
      case Value::Kind::kBool:
        text = key.as_bool() ? "true" : "false";
        break;
      case Value::Kind::kNone:
        text = "null";
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "keys must be str, int, float, bool or None, not ", TypeName(key)));
    }
    std::string out;
    AppendJsonString(text, ensure_ascii, &out);
    return out;
  }

  absl::Status WriteDict(const Dict& dict, int depth, std::string* out) {
    if (dict.empty()) {
      *out += "{}";
      return absl::OkStatus();
    }
    std::vector<const Dict::Entry*> entries;
    for (const Dict::Entry& e : dict.entries()) entries.push_back(&e);
    if (options_.sort_keys) {
      absl::Status status;
      std::stable_sort(entries.begin(), entries.end(),
                       [&status](const Dict::Entry* a, const Dict::Entry* b) {
                         absl::StatusOr<int> c = Compare(a->first, b->first);
                         if (!c.ok()) {
                           status = c.status();
                           return false;
                         }
                         return *c < 0;
                       });
      RETURN_IF_ERROR(status);
    }
    out->push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) *out += item_sep_;
      RETURN_IF_ERROR(NewLine(depth + 1, out));
      ASSIGN_OR_RETURN(std::string key,
                       KeyString(entries[i]->first, options_.ensure_ascii));
      absl::StrAppend(out, key, key_sep_);
      RETURN_IF_ERROR(Write(entries[i]->second, depth + 1, out));
    }
    RETURN_IF_ERROR(NewLine(depth, out));
    out->push_back('}');
    return absl::OkStatus();
  }

  const JsonOptions& options_;
  std::string item_sep_;
  std::string key_sep_;
};

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  JsonWriter writer(options);
  RETURN_IF_ERROR(writer.Write(v, 0, &out));
  if (out.size() > kMaxStringBytes) return TooLong();
  return out;
}

namespace {

absl::Status JsonTooDeep(int max_depth) {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON nested deeper than ", max_depth, " levels"));
}

// `depth`: the arrays and objects around `json`.
absl::StatusOr<Value> FromJsonAt(const nlohmann::ordered_json& json, int depth,
                                 int max_depth) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      // Python ints are unbounded; past int64 a double is the closest we keep.
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return Value::Float(static_cast<double>(u));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      if (depth >= max_depth) return JsonTooDeep(max_depth);
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) {
        ASSIGN_OR_RETURN(Value v, FromJsonAt(item, depth + 1, max_depth));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      if (depth >= max_depth) return JsonTooDeep(max_depth);
      Dict dict;
      for (const auto& [key, item] : json.items()) {
        ASSIGN_OR_RETURN(Value v, FromJsonAt(item, depth + 1, max_depth));
        dict.AppendNew(Value::String(key), std::move(v));
      }
      return Value::FromDict(std::move(dict));
    }
    default:
      // Binary and discarded values have no Python counterpart.
      return Value::None();
  }
}

}  // namespace

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json,
                               int max_depth) {
  return FromJsonAt(json, 0, max_depth);
}

absl::Status CheckJsonDepth(const nlohmann::ordered_json& json, int max_depth) {
  if (!json.is_structured()) return absl::OkStatus();
  if (max_depth < 1) return JsonTooDeep(max_depth);
  // An explicit stack of the containers being walked: the position reached
  // in each (the stack's size is the depth, so it never passes max_depth).
  using Iter = nlohmann::ordered_json::const_iterator;
  std::vector<std::pair<Iter, Iter>> stack;
  stack.emplace_back(json.cbegin(), json.cend());
  while (!stack.empty()) {
    auto& [it, end] = stack.back();
    if (it == end) {
      stack.pop_back();
      continue;
    }
    const nlohmann::ordered_json& child = *it;
    ++it;
    if (!child.is_structured()) continue;
    if (static_cast<int>(stack.size()) >= max_depth) {
      return JsonTooDeep(max_depth);
    }
    stack.emplace_back(child.cbegin(), child.cend());
  }
  return absl::OkStatus();
}

// --- UTF-8 and Python str helpers -------------------------------------------

std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t c = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(
        reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
        static_cast<utf8proc_ssize_t>(s.size() - i), &c);
    if (n <= 0) {
      // Invalid UTF-8 cannot come from JSON; keep going with U+FFFD.
      out.push_back(0xfffd);
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(c));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n =
      utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

bool IsAscii(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t Utf8Length(absl::string_view s) {
  size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  }
  return n;
}

bool IsPySpace(char32_t c) {
  if (c >= 0x09 && c <= 0x0d) return true;
  if (c >= 0x1c && c <= 0x20) return true;
  if (c < 0x80) return false;
  if (c == 0x85 || c == 0xa0 || c == 0x1680) return true;
  if (c >= 0x2000 && c <= 0x200a) return true;
  return c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string PyStrip(absl::string_view s, const std::string* chars, bool left,
                    bool right) {
  const std::u32string text = DecodeUtf8(s);
  std::u32string set;
  if (chars != nullptr) set = DecodeUtf8(*chars);
  auto strip = [&](char32_t c) {
    return chars == nullptr ? IsPySpace(c)
                            : set.find(c) != std::u32string::npos;
  };
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end && strip(text[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(text[end - 1])) --end;
  }
  return EncodeUtf8(std::u32string_view(text).substr(begin, end - begin));
}

namespace {

bool IsCased(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
      return true;
    default:
      return false;
  }
}

char32_t Upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return static_cast<char32_t>(
      utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

char32_t Lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return static_cast<char32_t>(
      utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

char32_t Title(char32_t c) {
  if (c < 0x80) return Upper(c);
  return static_cast<char32_t>(
      utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

}  // namespace

namespace {

// Python's full case mappings where they differ from the simple one
// (SpecialCasing.txt): the ones text actually meets.
const char* FullUpper(char32_t c) {
  switch (c) {
    case 0xdf:
      return "SS";
    case 0xfb00:
      return "FF";
    case 0xfb01:
      return "FI";
    case 0xfb02:
      return "FL";
    case 0xfb03:
      return "FFI";
    case 0xfb04:
      return "FFL";
    case 0xfb05:
    case 0xfb06:
      return "ST";
    default:
      return nullptr;
  }
}

const char* FullTitle(char32_t c) {
  switch (c) {
    case 0xdf:
      return "Ss";
    case 0xfb00:
      return "Ff";
    case 0xfb01:
      return "Fi";
    case 0xfb02:
      return "Fl";
    case 0xfb03:
      return "Ffi";
    case 0xfb04:
      return "Ffl";
    case 0xfb05:
    case 0xfb06:
      return "St";
    default:
      return nullptr;
  }
}

void AppendUpper(char32_t c, std::string* out) {
  if (const char* full = FullUpper(c)) {
    *out += full;
  } else {
    AppendUtf8(Upper(c), out);
  }
}

void AppendLower(char32_t c, std::string* out) {
  if (c == 0x130) {
    *out += "i\xcc\x87";  // U+0130 lowercases to "i" + combining dot above
  } else {
    AppendUtf8(Lower(c), out);
  }
}

void AppendTitle(char32_t c, std::string* out) {
  if (const char* full = FullTitle(c)) {
    *out += full;
  } else {
    AppendUtf8(Title(c), out);
  }
}

}  // namespace

std::string PyUpper(absl::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    }
    return out;
  }
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendUpper(c, &out);
  return out;
}

std::string PyLower(absl::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return out;
  }
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendLower(c, &out);
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (previous_cased) {
      AppendLower(c, &out);
    } else {
      AppendTitle(c, &out);
    }
    previous_cased = IsCased(c);
  }
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t c : DecodeUtf8(s)) {
    if (first) {
      AppendTitle(c, &out);
    } else {
      AppendLower(c, &out);
    }
    first = false;
  }
  return out;
}

std::vector<std::string> PySplitLines(absl::string_view s) {
  const std::u32string text = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char32_t c = text[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c ||
                          c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
                          c == 0x2028 || c == 0x2029;
    if (!boundary) {
      ++i;
      continue;
    }
    lines.push_back(
        EncodeUtf8(std::u32string_view(text).substr(start, i - start)));
    i += (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ? 2 : 1;
    start = i;
  }
  if (start < text.size()) {
    lines.push_back(EncodeUtf8(std::u32string_view(text).substr(start)));
  }
  return lines;
}

}  // namespace jinja
}  // namespace tessera
