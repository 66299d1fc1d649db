#include "runtime/grammar/json_schema.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/status.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/regex.h"

namespace tessera {
namespace grammar {
namespace {

using Json = nlohmann::ordered_json;

// Integers are at most 16 digits (the integer rule's bound).
constexpr int64_t kMaxInteger = 9999999999999999;

// Between tokens: nothing, one space, or a line break and an indent (what
// compact and pretty-printed JSON use); never a run of blank lines.
constexpr char kAnyWhitespace[] = "ws ::= ( \" \" | \"\\n\" [ \\t]{0,24} )?\n";
constexpr char kNoWhitespace[] = "ws ::= \"\"\n";
constexpr char kBaseRules[] = R"(json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json-nonnegative-number ::= ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-member ( "," ws json-member )* )? "}"
json-member ::= json-string ws ":" ws json-value ws
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";

// Keywords that constrain values and are not implemented: refused.
constexpr const char* kUnsupported[] = {"not",
                                        "if",
                                        "then",
                                        "else",
                                        "dependentRequired",
                                        "dependentSchemas",
                                        "dependencies",
                                        "patternProperties",
                                        "propertyNames",
                                        "minProperties",
                                        "maxProperties",
                                        "unevaluatedProperties",
                                        "unevaluatedItems",
                                        "contains",
                                        "minContains",
                                        "maxContains",
                                        "uniqueItems",
                                        "multipleOf",
                                        "contentEncoding",
                                        "contentMediaType"};

// Formats as JSON-safe regexes (RFC 3339, RFC 4122, a practical email).
const char* FormatRegex(const std::string& format) {
  // Years 0001-9999; days that every year has (no February 29th).
  static constexpr char kDate[] =
      "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-"
      "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|"
      "(0[13578]|1[02])-31)";
  static constexpr char kTime[] =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?"
      "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string kDateTime = std::string(kDate) + "T" + kTime;
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDateTime.c_str();
  if (format == "uuid") {
    return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
           "[0-9a-fA-F]{12}";
  }
  if (format == "email") {
    return "[a-zA-Z0-9_%+-]{1,32}(\\.[a-zA-Z0-9_%+-]{1,32}){0,4}@"
           "[a-zA-Z0-9-]{1,63}(\\.[a-zA-Z0-9-]{1,63}){1,4}";
  }
  if (format == "ipv4") {
    return "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
           "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  }
  return nullptr;
}

// The decimal strings of [lo, hi] (0 <= lo <= hi, no leading zeros) as EBNF.
std::string SameLengthRange(const std::string& a, const std::string& b) {
  if (a.size() == 1) {
    return a == b ? "\"" + a + "\"" : "[" + a + "-" + b + "]";
  }
  if (a[0] == b[0]) {
    return "\"" + std::string(1, a[0]) + "\" " +
           SameLengthRange(a.substr(1), b.substr(1));
  }
  const size_t rest = a.size() - 1;
  const std::string zeros(rest, '0'), nines(rest, '9');
  const std::string any_rest = absl::StrCat("[0-9]{", rest, "}");
  std::vector<std::string> alts;
  char first_full = a[0], last_full = b[0];
  if (a.substr(1) != zeros) {
    alts.push_back("\"" + std::string(1, a[0]) + "\" (" +
                   SameLengthRange(a.substr(1), nines) + ")");
    ++first_full;
  }
  if (b.substr(1) != nines) --last_full;
  if (first_full <= last_full) {
    alts.push_back((first_full == last_full
                        ? "\"" + std::string(1, first_full) + "\""
                        : "[" + std::string(1, first_full) + "-" +
                              std::string(1, last_full) + "]") +
                   " " + any_rest);
  }
  if (b.substr(1) != nines) {
    alts.push_back("\"" + std::string(1, b[0]) + "\" (" +
                   SameLengthRange(zeros, b.substr(1)) + ")");
  }
  return "(" + absl::StrJoin(alts, " | ") + ")";
}

std::string NonNegativeRange(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  std::string a = std::to_string(lo);
  const std::string b = std::to_string(hi);
  while (a.size() < b.size()) {
    alts.push_back(SameLengthRange(a, std::string(a.size(), '9')));
    a = "1" + std::string(a.size(), '0');
  }
  alts.push_back(SameLengthRange(a, b));
  return alts.size() == 1 ? alts[0] : "(" + absl::StrJoin(alts, " | ") + ")";
}

std::string IntegerRange(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) {
    // -x for x in [max(1, -hi), -lo].
    const int64_t nlo = std::max<int64_t>(1, hi < 0 ? -hi : 1);
    alts.push_back("\"-\" " + NonNegativeRange(nlo, -lo));
  }
  if (hi >= 0) alts.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
  return alts.size() == 1 ? alts[0] : "(" + absl::StrJoin(alts, " | ") + ")";
}

class Converter {
 public:
  Converter(const Json& root, const JsonSchemaOptions& options)
      : root_(root), options_(options) {}

  absl::StatusOr<std::string> Convert() {
    ASSIGN_OR_RETURN(std::string expr, Visit(root_, "root-value", 0));
    std::string out = "root ::= " + expr + "\n";
    for (const auto& [name, body] : rules_) {
      absl::StrAppend(&out, name, " ::= ", body, "\n");
    }
    out += options_.any_whitespace ? kAnyWhitespace : kNoWhitespace;
    out += kBaseRules;
    if (out.size() > kMaxGrammarBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("json schema: its grammar is ", out.size(),
                       " bytes; at most ", kMaxGrammarBytes));
    }
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json schema: ", what));
  }

  std::string NewRule(absl::string_view hint, std::string body) {
    std::string name;
    for (char c : hint) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9');
      name.push_back(ok ? c : '-');
      if (name.size() >= 40) break;
    }
    name = absl::StrCat("s-", name, "-", rules_.size());
    rules_.push_back({name, std::move(body)});
    return name;
  }

  static std::string Literal(const Json& value) {
    return "\"" + EbnfLiteral(value.dump()) + "\"";
  }

  absl::StatusOr<const Json*> Resolve(const std::string& ref) const {
    if (ref.empty() || ref[0] != '#') {
      return Error(absl::StrCat("$ref '", ref,
                                "': only references inside the schema (#...) "
                                "are supported"));
    }
    if (ref == "#") return &root_;
    try {
      const Json::json_pointer ptr(ref.substr(1));
      return &root_.at(ptr);
    } catch (const std::exception&) {
      return Error(absl::StrCat("$ref '", ref, "' points at nothing"));
    }
  }

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& hint,
                                    int depth) {
    if (depth > 2 * kMaxJsonDepth) {
      return Error("the schema nests too deeply");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Error(absl::StrCat("'", hint,
                                "' is the schema false, which no "
                                "value satisfies"));
    }
    if (!s.is_object()) {
      return Error(absl::StrCat("'", hint, "' is not a schema (an object)"));
    }
    for (const char* k : kUnsupported) {
      if (s.contains(k)) {
        return Error(
            absl::StrCat("'", k, "' (in '", hint, "') is not supported"));
      }
    }
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) return Error("$ref must be a string");
      const std::string ref = it->get<std::string>();
      if (auto done = refs_.find(ref); done != refs_.end()) return done->second;
      ASSIGN_OR_RETURN(const Json* target, Resolve(ref));
      // Named before it is visited, so a recursive schema refers to itself.
      const std::string name = NewRule(ref.substr(ref.rfind('/') + 1), "");
      refs_[ref] = name;
      const size_t index = rules_.size() - 1;
      ASSIGN_OR_RETURN(std::string body, Visit(*target, name, depth + 1));
      rules_[index].second = std::move(body);
      return name;
    }
    if (auto it = s.find("const"); it != s.end()) return Literal(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) {
        return Error("enum must be a non-empty array");
      }
      std::vector<std::string> alts;
      for (const Json& v : *it) alts.push_back(Literal(v));
      return "(" + absl::StrJoin(alts, " | ") + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty()) {
          return Error(absl::StrCat(key, " must be a non-empty array"));
        }
        std::vector<std::string> alts;
        int i = 0;
        for (const Json& sub : *it) {
          ASSIGN_OR_RETURN(std::string a,
                           Visit(sub, absl::StrCat(hint, "-", i++), depth + 1));
          alts.push_back(std::move(a));
        }
        return NewRule(hint, absl::StrJoin(alts, " | "));
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      ASSIGN_OR_RETURN(Json merged, MergeAllOf(s, *it));
      return Visit(merged, hint, depth + 1);
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const Json& t : *it) {
          if (!t.is_string()) return Error("type entries must be strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Error("type must be a string or a non-empty array");
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems")) {
      types.push_back("array");
    } else {
      return std::string("json-value");
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      ASSIGN_OR_RETURN(std::string a, Typed(s, t, hint, depth));
      alts.push_back(std::move(a));
    }
    if (alts.size() == 1) return alts[0];
    return NewRule(hint, absl::StrJoin(alts, " | "));
  }

  absl::StatusOr<Json> MergeAllOf(const Json& s, const Json& all) {
    if (!all.is_array() || all.empty()) {
      return Error("allOf must be a non-empty array");
    }
    Json merged = s;
    merged.erase("allOf");
    // additionalProperties counts only the properties of its own schema, so
    // it does not survive a merge of several schemas' properties.
    int with_properties = s.contains("properties") ? 1 : 0;
    bool additional = s.contains("additionalProperties");
    for (const Json& part : all) {
      if (!part.is_object()) continue;
      with_properties += part.contains("properties") ? 1 : 0;
      additional = additional || part.contains("additionalProperties");
    }
    if (additional && with_properties + (s.contains("additionalProperties") &&
                                                 !s.contains("properties")
                                             ? 1
                                             : 0) >
                          1) {
      return Error(
          "additionalProperties beside allOf schemas that declare properties "
          "is not supported (it would apply to each schema's own properties "
          "only)");
    }
    for (const Json& part0 : all) {
      const Json* part = &part0;
      if (part->is_object() && part->contains("$ref")) {
        ASSIGN_OR_RETURN(part, Resolve((*part)["$ref"].get<std::string>()));
      }
      if (!part->is_object()) return Error("allOf entries must be schemas");
      for (auto it = part->begin(); it != part->end(); ++it) {
        const std::string& key = it.key();
        if (key == "properties") {
          for (auto p = it->begin(); p != it->end(); ++p) {
            merged["properties"][p.key()] = *p;
          }
        } else if (key == "required") {
          for (const Json& r : *it) merged["required"].push_back(r);
        } else if (!merged.contains(key)) {
          merged[key] = *it;
        } else if (merged[key] != *it && key != "title" &&
                   key != "description") {
          return Error(
              absl::StrCat("allOf: '", key, "' differs between its schemas"));
        }
      }
    }
    return merged;
  }

  // A length or count keyword: a non-negative integer, or `fallback`.
  absl::StatusOr<int64_t> Count(const Json& s, const char* key,
                                int64_t fallback) const {
    auto it = s.find(key);
    if (it == s.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Error(absl::StrCat(key, " must be a non-negative integer"));
    }
    return it->get<int64_t>();
  }

  absl::StatusOr<std::optional<int64_t>> IntBound(const Json& s,
                                                  const char* key,
                                                  const char* exclusive,
                                                  int direction) {
    std::optional<int64_t> bound;
    auto read = [&](const Json& v, int64_t shift) -> absl::Status {
      if (!v.is_number()) return Error(absl::StrCat(key, " must be a number"));
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::fabs(d) > 1e18) {
        return Error(absl::StrCat(key, " is out of range"));
      }
      // minimum 2.5 means 3 for an integer; maximum 2.5 means 2.
      const int64_t b =
          static_cast<int64_t>(direction > 0 ? std::ceil(d) : std::floor(d));
      const int64_t value =
          b + (shift != 0 && static_cast<double>(b) == d ? shift : 0);
      bound = bound ? (direction > 0 ? std::max(*bound, value)
                                     : std::min(*bound, value))
                    : value;
      return absl::OkStatus();
    };
    if (auto it = s.find(key); it != s.end()) RETURN_IF_ERROR(read(*it, 0));
    if (auto it = s.find(exclusive); it != s.end()) {
      if (it->is_boolean()) {
        // Draft 4: a flag on minimum / maximum.
        if (it->get<bool>() && bound) bound = *bound + direction;
      } else {
        RETURN_IF_ERROR(read(*it, direction));
      }
    }
    return bound;
  }

  absl::StatusOr<std::string> Typed(const Json& s, const std::string& type,
                                    const std::string& hint, int depth) {
    if (type == "string") return StringRule(s, hint);
    if (type == "boolean") return std::string("json-boolean");
    if (type == "null") return std::string("json-null");
    if (type == "integer") {
      ASSIGN_OR_RETURN(auto lo, IntBound(s, "minimum", "exclusiveMinimum", 1));
      ASSIGN_OR_RETURN(auto hi, IntBound(s, "maximum", "exclusiveMaximum", -1));
      if (!lo && !hi) return std::string("json-integer");
      const int64_t a = std::max(lo.value_or(-kMaxInteger), -kMaxInteger);
      const int64_t b = std::min(hi.value_or(kMaxInteger), kMaxInteger);
      if (a > b) {
        return Error(
            absl::StrCat("'", hint, "': no integer is in [", a, ", ", b, "]"));
      }
      return NewRule(hint, IntegerRange(a, b));
    }
    if (type == "number") {
      const bool has_range = s.contains("minimum") || s.contains("maximum") ||
                             s.contains("exclusiveMinimum") ||
                             s.contains("exclusiveMaximum");
      if (!has_range) return std::string("json-number");
      if (s.size() >= 1 && s.contains("minimum") && s["minimum"] == 0 &&
          !s.contains("maximum") && !s.contains("exclusiveMinimum") &&
          !s.contains("exclusiveMaximum")) {
        return std::string("json-nonnegative-number");
      }
      return Error(absl::StrCat(
          "'", hint,
          "': ranges on numbers other than minimum 0 are not supported (use "
          "type integer for integer ranges)"));
    }
    if (type == "array") return ArrayRule(s, hint, depth);
    if (type == "object") return ObjectRule(s, hint, depth);
    return Error(absl::StrCat("unknown type '", type, "'"));
  }

  absl::StatusOr<std::string> StringRule(const Json& s,
                                         const std::string& hint) {
    std::string pattern;
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return Error("pattern must be a string");
      pattern = it->get<std::string>();
    } else if (auto f = s.find("format"); f != s.end() && f->is_string()) {
      if (const char* re = FormatRegex(f->get<std::string>())) pattern = re;
    }
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    if (!pattern.empty()) {
      if (has_length) {
        return Error(
            absl::StrCat("'", hint,
                         "': minLength / maxLength with a pattern or format is "
                         "not supported"));
      }
      RegexOptions options;
      options.json_string = true;
      auto re = RegexToEbnf(pattern, options);
      if (!re.ok()) {
        return Error(
            absl::StrCat("'", hint, "': pattern: ", re.status().message()));
      }
      return NewRule(hint, "\"\\\"\" " + *re + " \"\\\"\"");
    }
    if (!has_length) return std::string("json-string");
    ASSIGN_OR_RETURN(int64_t lo, Count(s, "minLength", 0));
    ASSIGN_OR_RETURN(int64_t hi, Count(s, "maxLength", -1));
    if (lo > kMaxRepetition || hi > kMaxRepetition) {
      return Error(absl::StrCat("'", hint, "': string lengths above ",
                                kMaxRepetition, " are not supported"));
    }
    if (hi >= 0 && hi < lo) return Error("maxLength is below minLength");
    const std::string reps = hi < 0 ? absl::StrCat("{", lo, ",}")
                                    : absl::StrCat("{", lo, ",", hi, "}");
    return NewRule(hint, "\"\\\"\" json-char" + reps + " \"\\\"\"");
  }

  absl::StatusOr<std::string> ArrayRule(const Json& s, const std::string& hint,
                                        int depth) {
    std::vector<std::string> prefix;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) return Error("prefixItems must be an array");
      int i = 0;
      for (const Json& sub : *it) {
        ASSIGN_OR_RETURN(std::string e,
                         Visit(sub, absl::StrCat(hint, "-", i++), depth + 1));
        prefix.push_back(std::move(e));
      }
    }
    std::string item = "json-value";
    bool more = true;  // Items past the prefix.
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>()) {
        more = false;
      } else if (it->is_array()) {
        return Error("items as an array (draft 4 tuples): use prefixItems");
      } else {
        ASSIGN_OR_RETURN(item, Visit(*it, hint + "-item", depth + 1));
      }
    }
    ASSIGN_OR_RETURN(int64_t lo, Count(s, "minItems", 0));
    ASSIGN_OR_RETURN(int64_t hi, Count(s, "maxItems", -1));  // -1: unbounded
    const int64_t k = static_cast<int64_t>(prefix.size());
    if (!more) hi = hi < 0 ? k : std::min(hi, k);
    if (lo > kMaxRepetition || hi > kMaxRepetition) {
      return Error(absl::StrCat("'", hint, "': item counts above ",
                                kMaxRepetition, " are not supported"));
    }
    if (hi >= 0 && hi < lo) {
      return Error(absl::StrCat("'", hint,
                                "': maxItems is below minItems (or "
                                "below the prefixItems required)"));
    }
    if (hi == 0) return NewRule(hint, "\"[\" ws \"]\"");
    const auto element = [&](int64_t i) { return i < k ? prefix[i] : item; };
    // Elements from index i on, given element i - 1 is there.
    std::string tail;
    {
      // Past the prefix: homogeneous, a repetition.
      const int64_t start = std::max<int64_t>(k, 1);
      std::string rest;
      if (hi < 0 || hi > start) {
        const int64_t min_rest = std::max<int64_t>(0, lo - start);
        const std::string reps =
            hi < 0 ? absl::StrCat("{", min_rest, ",}")
                   : absl::StrCat("{", min_rest, ",", hi - start, "}");
        rest = "(\",\" ws " + item + " ws)" + reps;
      }
      tail = rest;
      for (int64_t i = start - 1; i >= 1; --i) {
        const std::string e = "\",\" ws " + element(i) + " ws " + tail;
        tail = i < lo ? e : "(" + e + ")?";
      }
    }
    const std::string list = element(0) + " ws " + tail;
    return NewRule(hint, lo >= 1 ? "\"[\" ws " + list + " \"]\""
                                 : "\"[\" ws (" + list + ")? \"]\"");
  }

  absl::StatusOr<std::string> ObjectRule(const Json& s, const std::string& hint,
                                         int depth) {
    std::vector<std::pair<std::string, std::string>> props;  // key, value expr
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return Error("required must be an array");
      for (const Json& r : *it) {
        if (!r.is_string()) return Error("required entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    const auto props_it = s.find("properties");
    const bool has_props = props_it != s.end();
    std::set<std::string> named;
    if (has_props) {
      if (!props_it->is_object()) return Error("properties must be an object");
      for (auto p = props_it->begin(); p != props_it->end(); ++p) {
        ASSIGN_OR_RETURN(std::string v,
                         Visit(*p, hint + "-" + p.key(), depth + 1));
        props.push_back({p.key(), std::move(v)});
        named.insert(p.key());
      }
    }
    // additionalProperties: absent = none when properties are given.
    std::optional<std::string> additional;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (!it->is_boolean() || it->get<bool>()) {
        ASSIGN_OR_RETURN(std::string v,
                         Visit(*it, hint + "-additional", depth + 1));
        additional = std::move(v);
      }
    } else if (!has_props) {
      additional = "json-value";
    }
    for (const std::string& r : required) {
      if (named.count(r)) continue;
      if (!additional) {
        return Error(absl::StrCat("'", hint, "' requires '", r,
                                  "', which no property or additional "
                                  "property allows"));
      }
      props.push_back({r, *additional});
      named.insert(r);
    }
    std::vector<std::string> kv;
    std::vector<bool> needed;
    for (const auto& [key, value] : props) {
      kv.push_back("\"" + EbnfLiteral(Json(key).dump()) + "\" ws \":\" ws " +
                   value + " ws");
      needed.push_back(required.count(key) > 0);
    }
    const size_t n = kv.size();
    // seq[i][first]: the members from i on; `first` = no comma written yet.
    std::vector<std::array<std::string, 2>> seq(n + 1);
    for (int first = 0; first < 2; ++first) {
      if (!additional) {
        seq[n][first] = "";
      } else {
        const std::string akv =
            "json-string ws \":\" ws " + *additional + " ws";
        seq[n][first] = first ? "(" + akv + " (\",\" ws " + akv + ")*)?"
                              : "(\",\" ws " + akv + ")*";
        seq[n][first] = NewRule(hint + "-more", seq[n][first]);
      }
    }
    for (size_t i = n; i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        const std::string present =
            (first ? "" : "\",\" ws ") + kv[i] + " " + seq[i + 1][0];
        std::string body =
            needed[i]
                ? present
                : "(" + present + ") | " +
                      (seq[i + 1][first].empty() ? "\"\"" : seq[i + 1][first]);
        seq[i][first] = NewRule(hint, body);
      }
    }
    return NewRule(hint, "\"{\" ws " + seq[0][1] + " \"}\"");
  }

  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::pair<std::string, std::string>> rules_;
  absl::flat_hash_map<std::string, std::string> refs_;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToEbnf(const Json& schema,
                                             const JsonSchemaOptions& options) {
  return Converter(schema, options).Convert();
}

absl::StatusOr<std::string> JsonSchemaTextToEbnf(
    absl::string_view text, const JsonSchemaOptions& options) {
  RETURN_IF_ERROR(CheckJsonNesting(text));
  Json schema = Json::parse(text.begin(), text.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("json schema: not valid JSON");
  }
  return JsonSchemaToEbnf(schema, options);
}

std::string JsonObjectEbnf(const JsonSchemaOptions& options) {
  return std::string("root ::= json-object\n") +
         (options.any_whitespace ? kAnyWhitespace : kNoWhitespace) + kBaseRules;
}

}  // namespace grammar
}  // namespace tessera
