#include "runtime/model/config.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// A short description of a JSON value's type, for messages.
std::string TypeName(const Json& value) {
  if (value.is_number_integer()) return "integer";
  return value.type_name();
}

// `obj[key]` when present and not null; nullptr otherwise.
const Json* Find(const Json& obj, absl::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<int64_t> AsInt(const Json& value, absl::string_view key) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", key, "\" is out of range: ", v));
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return absl::InvalidArgumentError(
      absl::StrCat("config key \"", key, "\" must be an integer, found ",
                   TypeName(value), " ", value.dump()));
}

absl::StatusOr<double> AsDouble(const Json& value, absl::string_view key) {
  if (!value.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be a number, found ",
                     TypeName(value), " ", value.dump()));
  }
  return value.get<double>();
}

// A required integer that must be > 0.
absl::StatusOr<int64_t> RequiredPositiveInt(const Json& obj,
                                            absl::string_view key) {
  const Json* value = Find(obj, key);
  if (value == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is missing required key \"", key, "\""));
  }
  ASSIGN_OR_RETURN(const int64_t v, AsInt(*value, key));
  if (v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be positive, found ", v));
  }
  return v;
}

// An optional integer that must be > 0 when present; `fallback` otherwise.
absl::StatusOr<int64_t> OptionalPositiveInt(const Json& obj,
                                            absl::string_view key,
                                            int64_t fallback) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return fallback;
  ASSIGN_OR_RETURN(const int64_t v, AsInt(*value, key));
  if (v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be positive, found ", v));
  }
  return v;
}

// An optional positive number; `fallback` when absent or null.
absl::StatusOr<double> OptionalPositiveDouble(const Json& obj,
                                              absl::string_view key,
                                              double fallback) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return fallback;
  ASSIGN_OR_RETURN(const double v, AsDouble(*value, key));
  if (!(v > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be positive, found ", v));
  }
  return v;
}

absl::StatusOr<bool> OptionalBool(const Json& obj, absl::string_view key,
                                  bool fallback) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be a boolean, found ",
                     TypeName(*value), " ", value->dump()));
  }
  return value->get<bool>();
}

absl::StatusOr<std::optional<std::string>> OptionalString(
    const Json& obj, absl::string_view key) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be a string, found ",
                     TypeName(*value), " ", value->dump()));
  }
  return std::optional<std::string>(value->get<std::string>());
}

// Token ids are int32 everywhere past the config (a larger value would wrap
// when cast) and index the embedding table: an id that is not below the
// vocabulary is refused here, naming the key, never truncated or wrapped.
absl::Status CheckTokenIdRange(int64_t id, absl::string_view key,
                               int64_t vocab_size) {
  if (id > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key, "\" holds token id ", id,
        ", beyond the largest token id ", std::numeric_limits<int32_t>::max()));
  }
  if (vocab_size > 0 && id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" holds token id ", id,
                     ", not below vocab_size ", vocab_size));
  }
  return absl::OkStatus();
}

// Appends the token ids of an eos_token_id value (int, list of ints, or
// null) to `ids`, skipping ones already there. Each must be in
// [0, vocab_size) (no check when vocab_size is 0).
absl::Status AppendTokenIds(const Json* value, absl::string_view key,
                            int64_t vocab_size, std::vector<int64_t>* ids) {
  if (value == nullptr || value->is_null()) return absl::OkStatus();
  auto add = [&](const Json& item) -> absl::Status {
    ASSIGN_OR_RETURN(const int64_t id, AsInt(item, key));
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"", key, "\" holds a negative token id ", id));
    }
    RETURN_IF_ERROR(CheckTokenIdRange(id, key, vocab_size));
    if (std::find(ids->begin(), ids->end(), id) == ids->end()) {
      ids->push_back(id);
    }
    return absl::OkStatus();
  };
  if (value->is_array()) {
    for (const Json& item : *value) RETURN_IF_ERROR(add(item));
    return absl::OkStatus();
  }
  if (!value->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key, "\" must be an integer or a list of integers, ",
        "found ", TypeName(*value), " ", value->dump()));
  }
  return add(*value);
}

// ---------------------------------------------------------------------------
// Quantization (quantization_config / compression_config).

// Bounds on the module lists of a hostile config: a real ignore list names a
// few modules per layer (a 128-layer MoE's routers: a few hundred).
constexpr size_t kMaxModuleListEntries = 4096;
constexpr size_t kMaxModuleNameChars = 1024;
constexpr size_t kMaxModulePatterns = 256;
constexpr size_t kMaxConfigGroups = 64;

// "re:" module patterns, compiled by PCRE2 (already the tokenizer's regex
// library; it reads Python's dialect: (?P<name>...), \Z, lazy forms,
// lookaround) and run by its DFA matcher, which never backtracks: a hostile
// pattern ("(a*)*b") costs time linear in the name, and the workspace and
// the compiled pattern's size are bounded. Backreferences (which need
// backtracking) are refused when the config is parsed; a pattern whose run
// the DFA gives up on (recursion, a full workspace) matches nothing.
class ModuleRegex {
 public:
  static constexpr size_t kMaxModulePatternBytes = size_t{64} << 10;

  static absl::StatusOr<ModuleRegex> Compile(absl::string_view pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                      pattern.size(), 0, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(
          reinterpret_cast<const char*>(message), " at offset ", offset));
    }
    ModuleRegex re;
    re.code_.reset(code);
    // Backreferences need backtracking, which the DFA does not do; counted
    // repeats multiply a short pattern into a large program: both refused.
    uint32_t backrefs = 0;
    size_t bytes = 0;
    pcre2_pattern_info(code, PCRE2_INFO_BACKREFMAX, &backrefs);
    pcre2_pattern_info(code, PCRE2_INFO_SIZE, &bytes);
    if (backrefs > 0) {
      return absl::InvalidArgumentError(
          "backreferences are not supported in module patterns");
    }
    if (bytes > kMaxModulePatternBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the pattern compiles to ", bytes, " bytes, more than the ",
          kMaxModulePatternBytes, " supported"));
    }
    // A trial run: the DFA refuses what it cannot run here, not mid-load.
    int result = 0;
    if (!re.Run("", &result) && result < 0 && result != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(result, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrCat("not supported in module patterns: ",
                       reinterpret_cast<const char*>(message)));
    }
    return re;
  }

  // Python's re.match(pattern, text), as compressed-tensors and vLLM apply
  // "re:" entries: anchored at the start, free at the end (a match of any
  // prefix of `text` counts). A pattern the DFA gives up on (its workspace
  // full) matches nothing.
  bool MatchesPrefix(absl::string_view text) const {
    int result = 0;
    return Run(text, &result);
  }

 private:
  struct CodeFree {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  struct DataFree {
    void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
  };

  bool Run(absl::string_view text, int* result) const {
    std::unique_ptr<pcre2_match_data, DataFree> data(
        pcre2_match_data_create(1, nullptr));
    if (data == nullptr) return false;
    std::vector<int> workspace(4096);
    *result = pcre2_dfa_match(
        code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
        PCRE2_ANCHORED | PCRE2_DFA_SHORTEST, data.get(), nullptr,
        workspace.data(), workspace.size());
    return *result >= 0;
  }

  std::unique_ptr<pcre2_code, CodeFree> code_;
};

// fnmatch's `*` and `?` (ModelOpt's exclude_modules wildcards) over the
// whole name: the greedy two-pointer match, O(|name| × |pattern|), no
// recursion.
bool GlobMatches(absl::string_view pattern, absl::string_view name) {
  size_t p = 0, i = 0;
  size_t star = absl::string_view::npos, resume = 0;
  while (i < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[i])) {
      ++p, ++i;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = i;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      i = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// Whether `name`'s dotted components appear, whole and in order, in
// `module`'s ("mlp.gate" in "model.layers.0.mlp.gate", not in
// "model.layers.0.mlp.gate_proj"). Dots at either end ("model.layers.1.",
// as transformers' docs write a subtree; ".down_proj") are dropped.
bool ContainsComponents(absl::string_view module, absl::string_view name) {
  while (!name.empty() && name.back() == '.') name.remove_suffix(1);
  while (!name.empty() && name.front() == '.') name.remove_prefix(1);
  if (name.empty()) return false;
  for (size_t at = module.find(name); at != absl::string_view::npos;
       at = module.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || module[at - 1] == '.') &&
        (end == module.size() || module[end] == '.')) {
      return true;
    }
  }
  return false;
}

// One QuantConfig module-list entry against a module name (the rules in
// config.h's unquantized_modules).
bool ModuleMatches(absl::string_view entry, absl::string_view module) {
  if (absl::StartsWith(entry, "re:")) {
    // Parse compiled every entry once already; a QuantConfig built by hand
    // with a bad pattern matches nothing.
    absl::StatusOr<ModuleRegex> re = ModuleRegex::Compile(entry.substr(3));
    return re.ok() && re->MatchesPrefix(module);
  }
  if (entry.find_first_of("*?") != absl::string_view::npos) {
    return GlobMatches(entry, module);
  }
  return ContainsComponents(module, entry);
}

absl::Status QuantUnimplemented(absl::string_view what) {
  return absl::UnimplementedError(what);
}

// A list of module names at obj[key] (absent or null: none), appended to
// `out`. `path` names obj in messages ("quantization_config").
absl::Status AppendModuleList(const Json& obj, absl::string_view key,
                              absl::string_view path,
                              std::vector<std::string>* out) {
  const Json* list = Find(obj, key);
  if (list == nullptr) return absl::OkStatus();
  const std::string where = absl::StrCat(path, ".", key);
  if (!list->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", where, "\" must be a list of strings, ",
                     "found ", TypeName(*list)));
  }
  if (list->size() + out->size() > kMaxModuleListEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", where, "\" has ", list->size(), " entries, more than ",
        "the ", kMaxModuleListEntries, " supported"));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& item = (*list)[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", at, "\" must be a string, found ",
                       TypeName(item), " ", item.dump().substr(0, 100)));
    }
    const std::string& name = item.get_ref<const std::string&>();
    if (name.empty() || name.size() > kMaxModuleNameChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"", at, "\" must be a module name of 1 to ",
          kMaxModuleNameChars, " characters, found ", name.size()));
    }
    if (absl::StartsWith(name, "re:")) {
      // Each pattern is compiled and run for every linear module of the
      // model as the weight table is built: their number is bounded too.
      const size_t patterns = std::count_if(
          out->begin(), out->end(),
          [](const std::string& e) { return absl::StartsWith(e, "re:"); });
      if (patterns >= kMaxModulePatterns) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"", at, "\": more than ",
                         kMaxModulePatterns, " \"re:\" patterns"));
      }
      absl::StatusOr<ModuleRegex> re = ModuleRegex::Compile(name.substr(3));
      if (!re.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"", at, "\" holds the pattern \"",
                         name.substr(0, 100), "\": ", re.status().message()));
      }
    }
    out->push_back(name);
  }
  return absl::OkStatus();
}

// An optional string field of a quantization object, `where` naming it.
absl::StatusOr<std::optional<std::string>> QuantString(
    const Json& obj, absl::string_view key, absl::string_view where) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", where, ".", key, "\" must be a string, found ",
        TypeName(*value), " ", value->dump().substr(0, 100)));
  }
  const std::string& s = value->get_ref<const std::string&>();
  if (s.size() > kMaxModuleNameChars) {
    return absl::InvalidArgumentError(absl::StrCat("config key \"", where, ".",
                                                   key, "\" is ", s.size(),
                                                   " characters long"));
  }
  return std::optional<std::string>(s);
}

// A [rows, cols] block size (weight_block_size, block_structure): two
// positive integers.
absl::StatusOr<std::pair<int64_t, int64_t>> BlockSize(const Json& value,
                                                      const std::string& key) {
  if (!value.is_array() || value.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key,
                     "\" must be a list of two positive integers, found ",
                     value.dump().substr(0, 100)));
  }
  ASSIGN_OR_RETURN(const int64_t rows, AsInt(value[0], key));
  ASSIGN_OR_RETURN(const int64_t cols, AsInt(value[1], key));
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key,
        "\" must be a list of two positive integers, found ", value.dump()));
  }
  return std::make_pair(rows, cols);
}

// The only block the kernels take (WeightView's kBlock: square B = 128, as
// DeepSeek-V3's and Qwen3's FP8 checkpoints have it).
constexpr int64_t kFp8Block = 128;

// compressed-tensors' QuantizationArgs, with its defaults (num_bits 8, type
// "int", symmetric, static; strategy from group_size / block_structure).
struct CtArgs {
  int64_t num_bits = 8;
  std::string type = "int";
  bool symmetric = true;
  std::string dynamic = "false";  // "false", "true" or "local".
  std::string strategy;
  int64_t group_size = 0;  // 0: none; -1: per channel (GPTQ's spelling).
  int64_t block_rows = 0, block_cols = 0;
};

absl::StatusOr<CtArgs> ReadCtArgs(const Json& args, const std::string& where) {
  if (!args.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", where, "\" must be an object or null, ",
                     "found ", TypeName(args)));
  }
  CtArgs a;
  const std::string bits_key = where + ".num_bits";
  if (const Json* v = Find(args, "num_bits")) {
    ASSIGN_OR_RETURN(a.num_bits, AsInt(*v, bits_key));
    if (a.num_bits <= 0 || a.num_bits > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", bits_key,
                       "\" must be in [1, 64], found ", a.num_bits));
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> type,
                   QuantString(args, "type", where));
  if (type.has_value()) a.type = absl::AsciiStrToLower(*type);
  if (a.type != "int" && a.type != "float") {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", where, ".type\" must be \"int\" or ",
                     "\"float\", found \"", *type, "\""));
  }
  ASSIGN_OR_RETURN(a.symmetric, OptionalBool(args, "symmetric", true));
  if (const Json* v = Find(args, "dynamic")) {
    if (v->is_boolean()) {
      a.dynamic = v->get<bool>() ? "true" : "false";
    } else if (v->is_string() && v->get_ref<const std::string&>() == "local") {
      a.dynamic = "local";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", where, ".dynamic\" must be a boolean ",
                       "or \"local\", found ", v->dump().substr(0, 100)));
    }
  }
  if (const Json* v = Find(args, "group_size")) {
    const std::string key = where + ".group_size";
    ASSIGN_OR_RETURN(a.group_size, AsInt(*v, key));
    if (a.group_size == 0 || a.group_size < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", key,
                       "\" must be positive (or -1), found ", a.group_size));
    }
  }
  if (const Json* v = Find(args, "block_structure")) {
    ASSIGN_OR_RETURN(const auto block,
                     BlockSize(*v, where + ".block_structure"));
    a.block_rows = block.first;
    a.block_cols = block.second;
  }
  ASSIGN_OR_RETURN(std::optional<std::string> strategy,
                   QuantString(args, "strategy", where));
  if (strategy.has_value()) {
    a.strategy = absl::AsciiStrToLower(*strategy);
    static constexpr absl::string_view kStrategies[] = {
        "tensor", "channel",      "group",    "block",
        "token",  "tensor_group", "attn_head"};
    if (std::find(std::begin(kStrategies), std::end(kStrategies), a.strategy) ==
        std::end(kStrategies)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"", where, ".strategy\": unknown strategy \"", *strategy,
          "\" (known: ", absl::StrJoin(kStrategies, ", "), ")"));
    }
  } else if (a.block_rows > 0) {
    a.strategy = "block";
  } else if (a.group_size > 0) {
    a.strategy = "group";
  } else if (a.group_size == -1) {
    a.strategy = "channel";
  } else {
    a.strategy = "tensor";
  }
  return a;
}

// One compressed-tensors config group's scheme, in QuantConfig's terms.
struct CtScheme {
  Fp8WeightScale weight_scale = Fp8WeightScale::kPerChannel;
  int64_t block = 0;
  Fp8InputScale input_scale = Fp8InputScale::kDynamicPerToken;
  bool operator==(const CtScheme& o) const {
    return weight_scale == o.weight_scale && block == o.block &&
           input_scale == o.input_scale;
  }
};

std::string DescribeScheme(const CtScheme& s) {
  const char* weights =
      s.weight_scale == Fp8WeightScale::kPerTensor    ? "per-tensor"
      : s.weight_scale == Fp8WeightScale::kPerChannel ? "per-channel"
                                                      : "block";
  const char* inputs =
      s.input_scale == Fp8InputScale::kDynamicPerToken   ? "dynamic per-token"
      : s.input_scale == Fp8InputScale::kStaticPerTensor ? "static per-tensor"
                                                         : "dynamic per-group";
  return absl::StrCat("fp8 ", weights, " weights, ", inputs, " activations");
}

constexpr absl::string_view kSupportedCtSchemes =
    "(supported: float 8-bit symmetric static weights per tensor, channel or "
    "128x128 block)";

// A config group's `weights` and `input_activations` as a scheme.
absl::StatusOr<CtScheme> ReadCtScheme(const Json& group,
                                      const std::string& where) {
  CtScheme scheme;
  const Json* weights = Find(group, "weights");
  if (weights == nullptr) {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where,
        " quantizes no weights (activation-only quantization is not "
        "supported yet)"));
  }
  ASSIGN_OR_RETURN(const CtArgs w, ReadCtArgs(*weights, where + ".weights"));
  if (w.type == "int") {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where, " has int", w.num_bits,
        " weights, which are not supported yet ", kSupportedCtSchemes));
  }
  if (w.num_bits != 8) {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where, " has ", w.num_bits, "-bit float weights",
        w.num_bits == 4 ? " (fp4: nvfp4 / mxfp4)" : "",
        ", which are not supported yet ", kSupportedCtSchemes));
  }
  if (!w.symmetric) {
    return QuantUnimplemented(absl::StrCat("compressed-tensors ", where,
                                           " has asymmetric fp8 weights, which "
                                           "are not supported yet ",
                                           kSupportedCtSchemes));
  }
  if (w.dynamic != "false") {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where, " has dynamic (", w.dynamic,
        ") weight scales, which are not supported yet ", kSupportedCtSchemes));
  }
  if (w.strategy == "tensor") {
    scheme.weight_scale = Fp8WeightScale::kPerTensor;
  } else if (w.strategy == "channel") {
    scheme.weight_scale = Fp8WeightScale::kPerChannel;
  } else if (w.strategy == "block") {
    if (w.block_rows == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", where, ".weights.block_structure\" ",
                       "is required by strategy \"block\""));
    }
    if (w.block_rows != kFp8Block || w.block_cols != kFp8Block) {
      return QuantUnimplemented(absl::StrCat(
          "compressed-tensors ", where, " has fp8 blocks of ", w.block_rows,
          "x", w.block_cols, ", which are not supported yet (only 128x128)"));
    }
    scheme.weight_scale = Fp8WeightScale::kBlock;
    scheme.block = kFp8Block;
  } else {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where, " has fp8 weights of strategy \"",
        w.strategy, "\"",
        w.group_size > 0 ? absl::StrCat(" (group_size ", w.group_size, ")")
                         : "",
        ", which is not supported yet ", kSupportedCtSchemes));
  }

  if (Find(group, "output_activations") != nullptr) {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where,
        " quantizes output activations, which is not supported yet"));
  }
  const Json* inputs = Find(group, "input_activations");
  // Weight-only (W8A16): the activations stay in the model's dtype. Run as
  // dynamic per-token fp8 activations, the fp8 path's finest activation
  // scaling (an fp8 backend's weight-only path widens the weights anyway).
  if (inputs == nullptr) return scheme;
  const std::string in_where = where + ".input_activations";
  ASSIGN_OR_RETURN(const CtArgs a, ReadCtArgs(*inputs, in_where));
  if (a.type != "float" || a.num_bits != 8) {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors ", where, " quantizes activations to ", a.type,
        a.num_bits, ", which is not supported yet (only float 8-bit)"));
  }
  if (!a.symmetric) {
    return QuantUnimplemented(absl::StrCat("compressed-tensors ", where,
                                           " has asymmetric activations, which "
                                           "are not supported yet"));
  }
  const std::string unsupported_inputs = absl::StrCat(
      "compressed-tensors ", where, " has ",
      a.dynamic == "false" ? "static" : "dynamic",
      " activations of strategy \"", a.strategy,
      "\", which are not supported yet (supported: dynamic "
      "\"token\", static \"tensor\", dynamic \"group\" of 128 with 128x128 "
      "block weights)");
  if (a.dynamic == "true" && a.strategy == "token") {
    scheme.input_scale = Fp8InputScale::kDynamicPerToken;
  } else if (a.dynamic == "false" && a.strategy == "tensor") {
    if (scheme.weight_scale == Fp8WeightScale::kBlock) {
      return QuantUnimplemented(
          absl::StrCat("compressed-tensors ", where,
                       " has static activations with block "
                       "weights, which are not supported yet"));
    }
    scheme.input_scale = Fp8InputScale::kStaticPerTensor;
  } else if (a.dynamic == "true" && a.strategy == "group" &&
             a.group_size == kFp8Block &&
             scheme.weight_scale == Fp8WeightScale::kBlock) {
    scheme.input_scale = Fp8InputScale::kDynamicPerGroup;
  } else {
    return QuantUnimplemented(unsupported_inputs);
  }
  return scheme;
}

// compressed-tensors' formats: the ones that store fp8 matrices as they are
// (naive-quantized is the older name of float-quantized for fp8, and also
// of int8; the weights' type decides), and the known rest.
bool IsFp8CtFormat(absl::string_view format) {
  return format == "float-quantized" || format == "naive-quantized";
}
bool IsKnownCtFormat(absl::string_view format) {
  for (absl::string_view known :
       {"dense", "int-quantized", "pack-quantized", "marlin-24",
        "sparse-bitmask", "sparse-24-bitmask", "nvfp4-pack-quantized",
        "mxfp4-pack-quantized", "mixed-precision"}) {
    if (format == known) return true;
  }
  return false;
}

// A compressed-tensors `format` (top-level or a group's): fine when it
// stores fp8 as is (or is absent); Unimplemented for the other known ones,
// InvalidArgument for unknown ones.
absl::Status CheckCtFormat(const Json& obj, absl::string_view where,
                           bool allow_mixed) {
  ASSIGN_OR_RETURN(const std::optional<std::string> format,
                   QuantString(obj, "format", where));
  if (!format.has_value() || IsFp8CtFormat(*format)) return absl::OkStatus();
  if (allow_mixed && *format == "mixed-precision") return absl::OkStatus();
  if (IsKnownCtFormat(*format)) {
    return QuantUnimplemented(absl::StrCat(
        "compressed-tensors format \"", *format, "\" (", where,
        ".format) is not supported yet (supported: float-quantized fp8)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "config key \"", where, ".format\": unknown compressed-tensors format \"",
      *format, "\""));
}

absl::Status ParseCompressedTensors(const Json& qc, const std::string& path,
                                    QuantConfig* quant) {
  // CompressedTensorsConfig.from_dict also takes the quantization part
  // nested, beside a sparsity_config.
  const Json* body = &qc;
  std::string where = path;
  if (const Json* nested = Find(qc, "quantization_config")) {
    if (!nested->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", path, ".quantization_config\" must ",
                       "be an object, found ", TypeName(*nested)));
    }
    body = nested;
    where = path + ".quantization_config";
  }
  for (const Json* obj : {&qc, body}) {
    const Json* sparsity = Find(*obj, "sparsity_config");
    if (sparsity == nullptr) continue;
    if (!sparsity->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"", path, ".sparsity_config\" must be an object, found ",
          TypeName(*sparsity)));
    }
    const Json* format = Find(*sparsity, "format");
    const bool dense = format != nullptr && format->is_string() &&
                       format->get_ref<const std::string&>() == "dense";
    if (!sparsity->empty() && !dense) {
      return QuantUnimplemented(absl::StrCat(
          "compressed-tensors sparse checkpoints (", path,
          ".sparsity_config format ",
          format == nullptr ? std::string("absent") : format->dump(),
          ") are not supported yet"));
    }
  }
  RETURN_IF_ERROR(CheckCtFormat(*body, where, /*allow_mixed=*/true));

  const Json* groups = Find(*body, "config_groups");
  const std::string groups_key = where + ".config_groups";
  if (groups == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is missing required key \"", groups_key, "\""));
  }
  if (!groups->is_object() || groups->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", groups_key, "\" must be a non-empty ",
                     "object, found ", groups->dump().substr(0, 100)));
  }
  if (groups->size() > kMaxConfigGroups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", groups_key, "\" has ", groups->size(),
        " groups, more than the ", kMaxConfigGroups, " supported"));
  }
  std::optional<CtScheme> scheme;
  std::string scheme_group;
  bool all_linear = false;
  std::vector<std::string> targets;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string group_where =
        absl::StrCat(groups_key, ".", it.key().substr(0, 100));
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", group_where, "\" must be an object, ",
                       "found ", TypeName(*it)));
    }
    RETURN_IF_ERROR(CheckCtFormat(*it, group_where, /*allow_mixed=*/false));
    ASSIGN_OR_RETURN(const CtScheme s, ReadCtScheme(*it, group_where));
    if (scheme.has_value() && !(s == *scheme)) {
      return QuantUnimplemented(absl::StrCat(
          "compressed-tensors config groups with different schemes are not "
          "supported yet: ",
          scheme_group, " (", DescribeScheme(*scheme), ") and ", group_where,
          " (", DescribeScheme(s), ")"));
    }
    if (!scheme.has_value()) {
      scheme = s;
      scheme_group = group_where;
    }
    const Json* group_targets = Find(*it, "targets");
    if (group_targets == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config is missing required key \"", group_where, ".targets\""));
    }
    std::vector<std::string> names;
    RETURN_IF_ERROR(AppendModuleList(*it, "targets", group_where, &names));
    for (const std::string& name : names) {
      if (name == "Linear") {
        all_linear = true;
        continue;
      }
      // A target is a module name, a "re:" pattern, or a class name; only
      // the class of every linear layer is understood.
      const bool class_name =
          !absl::StartsWith(name, "re:") &&
          name.find('.') == std::string::npos &&
          absl::ascii_isupper(static_cast<unsigned char>(name[0]));
      if (class_name) {
        return QuantUnimplemented(absl::StrCat(
            "compressed-tensors ", group_where, " targets the class \"", name,
            "\", which is not supported yet (supported: \"Linear\", module "
            "names and \"re:\" patterns)"));
      }
      if (targets.size() >= kMaxModuleListEntries) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"", groups_key, "\" has more than ",
                         kMaxModuleListEntries, " targets"));
      }
      targets.push_back(name);
    }
  }
  quant->method = "compressed-tensors";
  quant->weight_scale = scheme->weight_scale;
  quant->block_rows = quant->block_cols = scheme->block;
  quant->input_scale = scheme->input_scale;
  quant->scale_suffix = "weight_scale";
  if (!all_linear) quant->quantized_modules = std::move(targets);
  RETURN_IF_ERROR(
      AppendModuleList(*body, "ignore", where, &quant->unquantized_modules));
  // kv_cache_scheme: 8-bit float k/v scales per tensor are loaded (an fp8
  // KV cache uses them); any other scheme's tensors are not read, and the KV
  // cache keeps --kv-dtype.
  if (const Json* kv = Find(*body, "kv_cache_scheme");
      kv != nullptr && kv->is_object()) {
    const Json* type = Find(*kv, "type");
    const Json* bits = Find(*kv, "num_bits");
    const Json* strategy = Find(*kv, "strategy");
    quant->kv_cache_scales = type != nullptr && type->is_string() &&
                             *type == "float" && bits != nullptr &&
                             bits->is_number_integer() && *bits == 8 &&
                             (strategy == nullptr ||
                              (strategy->is_string() && *strategy == "tensor"));
  }
  // quantization_status is not checked either: older naive-quantized fp8
  // checkpoints say "frozen" with fp8 matrices on disk; the format tells.
  return absl::OkStatus();
}

// "fp8": transformers' FineGrainedFP8Config (DeepSeek-V3, Qwen3-*-FP8) and
// vLLM's Fp8Config serialization (AutoFP8's per-tensor checkpoints).
absl::Status ParseFp8Method(const Json& qc, const std::string& path,
                            QuantConfig* quant) {
  ASSIGN_OR_RETURN(const std::optional<std::string> scheme_name,
                   QuantString(qc, "activation_scheme", path));
  if (!scheme_name.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config is missing required key \"", path, ".activation_scheme\""));
  }
  const std::string scheme = absl::AsciiStrToLower(*scheme_name);
  if (scheme != "dynamic" && scheme != "static") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", path, ".activation_scheme\" must be \"dynamic\" or ",
        "\"static\", found \"", *scheme_name, "\""));
  }
  ASSIGN_OR_RETURN(const std::optional<std::string> fmt,
                   QuantString(qc, "fmt", path));
  if (fmt.has_value() && *fmt != "e4m3") {
    if (*fmt == "e5m2") {
      return QuantUnimplemented(absl::StrCat("fp8 format \"e5m2\" (", path,
                                             ".fmt) is not supported yet "
                                             "(only \"e4m3\")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", path, ".fmt\" must be \"e4m3\" or \"e5m2\", found \"",
        *fmt, "\""));
  }
  // DeepSeek-V3.1's ue8m0 scales round each activation scale up to a power
  // of two; the kernels compute exact amax / 448 scales.
  ASSIGN_OR_RETURN(const std::optional<std::string> scale_fmt,
                   QuantString(qc, "scale_fmt", path));
  if (scale_fmt.has_value() && *scale_fmt != "float") {
    if (*scale_fmt == "ue8m0") {
      return QuantUnimplemented(absl::StrCat("fp8 scale_fmt \"ue8m0\" (", path,
                                             ".scale_fmt) is not supported "
                                             "yet (only \"float\")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", path, ".scale_fmt\" must be \"float\" or \"ue8m0\", ",
        "found \"", *scale_fmt, "\""));
  }
  quant->method = "fp8";
  if (const Json* block = Find(qc, "weight_block_size")) {
    ASSIGN_OR_RETURN(const auto size,
                     BlockSize(*block, path + ".weight_block_size"));
    if (size.first != kFp8Block || size.second != kFp8Block) {
      return QuantUnimplemented(
          absl::StrCat("fp8 weight_block_size [", size.first, ", ", size.second,
                       "] is not supported yet (only [128, 128])"));
    }
    if (scheme == "static") {
      return QuantUnimplemented(
          "fp8 activation_scheme \"static\" with weight_block_size is not "
          "supported yet (block checkpoints quantize activations per group "
          "at run time)");
    }
    quant->weight_scale = Fp8WeightScale::kBlock;
    quant->block_rows = quant->block_cols = kFp8Block;
    quant->input_scale = Fp8InputScale::kDynamicPerGroup;
    quant->scale_suffix = "weight_scale_inv";
  } else {
    // vLLM's reading: no block size is one scale per matrix. (transformers
    // would default to 128 x 128 blocks; their scales are named
    // weight_scale_inv, so the loader tells the two apart by name.)
    quant->weight_scale = Fp8WeightScale::kPerTensor;
    quant->input_scale = scheme == "static" ? Fp8InputScale::kStaticPerTensor
                                            : Fp8InputScale::kDynamicPerToken;
    quant->scale_suffix = "weight_scale";
  }
  RETURN_IF_ERROR(AppendModuleList(qc, "modules_to_not_convert", path,
                                   &quant->unquantized_modules));
  RETURN_IF_ERROR(AppendModuleList(qc, "ignored_layers", path,
                                   &quant->unquantized_modules));
  return absl::OkStatus();
}

// "modelopt": NVIDIA ModelOpt as vLLM reads it, the quant_algo at the top
// (config.json: {"quant_method": "modelopt", "quant_algo": "FP8", "ignore":
// [...]}) or nested as hf_quant_config.json holds it ({"quantization":
// {"quant_algo": ..., "exclude_modules": [...]}}).
absl::Status ParseModelopt(const Json& qc, const std::string& path,
                           QuantConfig* quant) {
  const Json* body = &qc;
  std::string where = path;
  if (const Json* nested = Find(qc, "quantization")) {
    if (!nested->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", path, ".quantization\" must be an ",
                       "object, found ", TypeName(*nested)));
    }
    body = nested;
    where = path + ".quantization";
  }
  ASSIGN_OR_RETURN(const std::optional<std::string> algo_name,
                   QuantString(*body, "quant_algo", where));
  if (!algo_name.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config is missing required key \"", where, ".quant_algo\""));
  }
  // vLLM upper-cases it (ModelOpt has emitted lowercase).
  const std::string algo = absl::AsciiStrToUpper(*algo_name);
  quant->method = "modelopt";
  quant->scale_suffix = "weight_scale";
  if (algo == "FP8") {
    quant->weight_scale = Fp8WeightScale::kPerTensor;
    quant->input_scale = Fp8InputScale::kStaticPerTensor;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    quant->weight_scale = Fp8WeightScale::kPerChannel;
    quant->input_scale = Fp8InputScale::kDynamicPerToken;
  } else {
    return QuantUnimplemented(absl::StrCat(
        "modelopt quant_algo \"", algo_name->substr(0, 100),
        "\" is not supported yet (supported: FP8, FP8_PER_CHANNEL_PER_TOKEN)"));
  }
  // kv_cache_quant_algo FP8: per-layer k/v scales are loaded (an fp8 KV
  // cache uses them); anything else is not read.
  for (const Json* scope : {body, &qc}) {
    const Json* kv = Find(*scope, "kv_cache_quant_algo");
    if (kv != nullptr && kv->is_string() &&
        absl::AsciiStrToUpper(kv->get<std::string>()) == "FP8") {
      quant->kv_cache_scales = true;
    }
  }
  RETURN_IF_ERROR(AppendModuleList(*body, "exclude_modules", where,
                                   &quant->unquantized_modules));
  RETURN_IF_ERROR(
      AppendModuleList(*body, "ignore", where, &quant->unquantized_modules));
  return absl::OkStatus();
}

// "fbgemm_fp8" (meta-llama/Llama-3.1-405B-Instruct-FP8): per-row weight
// scales, activations quantized per row at run time.
absl::Status ParseFbgemmFp8(const Json& qc, const std::string& path,
                            QuantConfig* quant) {
  quant->method = "fbgemm_fp8";
  quant->weight_scale = Fp8WeightScale::kPerChannel;
  quant->input_scale = Fp8InputScale::kDynamicPerToken;
  quant->scale_suffix = "weight_scale";
  // FbgemmFp8Config's default.
  quant->activation_scale_ub = 1200.0;
  if (const Json* ub = Find(qc, "activation_scale_ub")) {
    const std::string key = path + ".activation_scale_ub";
    ASSIGN_OR_RETURN(quant->activation_scale_ub, AsDouble(*ub, key));
    if (!(quant->activation_scale_ub > 0) ||
        !std::isfinite(quant->activation_scale_ub)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"", key, "\" must be positive, found ", ub->dump()));
    }
  }
  return AppendModuleList(qc, "modules_to_not_convert", path,
                          &quant->unquantized_modules);
}

// Methods transformers or vLLM define that we do not load.
constexpr absl::string_view kUnsupportedQuantMethods[] = {"awq",
                                                          "awq_marlin",
                                                          "gptq",
                                                          "gptq_marlin",
                                                          "gptq_marlin_24",
                                                          "gptq_bitblas",
                                                          "bitblas",
                                                          "marlin",
                                                          "bitsandbytes",
                                                          "quark",
                                                          "mxfp4",
                                                          "gguf",
                                                          "hqq",
                                                          "eetq",
                                                          "aqlm",
                                                          "torchao",
                                                          "bitnet",
                                                          "higgs",
                                                          "vptq",
                                                          "spqr",
                                                          "auto-round",
                                                          "auto_round",
                                                          "quanto",
                                                          "fp_quant",
                                                          "sinq",
                                                          "metal",
                                                          "modelopt_fp4",
                                                          "modelopt_mxfp8",
                                                          "ptpc_fp8",
                                                          "experts_int8",
                                                          "deepspeedfp",
                                                          "tpu_int8",
                                                          "moe_wna16",
                                                          "ipex",
                                                          "inc",
                                                          "rtn",
                                                          "petit_nvfp4",
                                                          "cpu_awq",
                                                          "exl2",
                                                          "sparseml",
                                                          "fouroversix",
                                                          "four_over_six",
                                                          "gemma"};

constexpr absl::string_view kSupportedQuantMethods =
    "(supported: compressed-tensors fp8, fp8, modelopt FP8, fbgemm_fp8)";

// Fills `quant` from the checkpoint's quantization_config (or the older
// compression_config); leaves it unquantized when there is neither.
absl::Status ParseQuantization(const Json& root, QuantConfig* quant) {
  const char* key = "quantization_config";
  const Json* qc = Find(root, key);
  if (qc == nullptr) {
    key = "compression_config";
    qc = Find(root, key);
  }
  if (qc == nullptr) return absl::OkStatus();
  if (!qc->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key, "\" must be an object, found ", TypeName(*qc)));
  }
  const Json* method = Find(*qc, "quant_method");
  if (method == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key,
        "\" has no \"quant_method\"; cannot tell how the weights are "
        "quantized"));
  }
  if (!method->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key, ".quant_method\" must be a string: ",
        "unknown quantization method ", method->dump().substr(0, 100)));
  }
  const std::string name = method->get<std::string>().substr(0, 100);
  const std::string lower = absl::AsciiStrToLower(name);
  QuantConfig parsed;
  if (lower == "compressed-tensors") {
    RETURN_IF_ERROR(ParseCompressedTensors(*qc, key, &parsed));
  } else if (lower == "fp8") {
    RETURN_IF_ERROR(ParseFp8Method(*qc, key, &parsed));
  } else if (lower == "modelopt") {
    RETURN_IF_ERROR(ParseModelopt(*qc, key, &parsed));
  } else if (lower == "fbgemm_fp8") {
    RETURN_IF_ERROR(ParseFbgemmFp8(*qc, key, &parsed));
  } else if (std::find(std::begin(kUnsupportedQuantMethods),
                       std::end(kUnsupportedQuantMethods),
                       lower) != std::end(kUnsupportedQuantMethods)) {
    return absl::UnimplementedError(absl::StrCat("quantization method \"", name,
                                                 "\" is not supported yet ",
                                                 kSupportedQuantMethods));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown quantization method \"", name, "\" ", kSupportedQuantMethods));
  }
  *quant = std::move(parsed);
  return absl::OkStatus();
}

absl::Status CheckPartialRotary(const Json& obj, absl::string_view where) {
  const Json* value = Find(obj, "partial_rotary_factor");
  if (value == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const double factor,
                   AsDouble(*value, "partial_rotary_factor"));
  if (factor != 1.0) {
    return absl::UnimplementedError(
        absl::StrCat(where, "partial_rotary_factor ", factor,
                     " is not supported yet (only 1.0)"));
  }
  return absl::OkStatus();
}

// partial_rotary_factor: rope_parameters' value, else the top-level key, else
// 1. In (0, 1].
absl::StatusOr<double> PartialRotaryFactor(const Json& root,
                                           const Json* params) {
  const Json* value =
      params != nullptr ? Find(*params, "partial_rotary_factor") : nullptr;
  if (value == nullptr) value = Find(root, "partial_rotary_factor");
  if (value == nullptr) return 1.0;
  ASSIGN_OR_RETURN(const double factor,
                   AsDouble(*value, "partial_rotary_factor"));
  if (!(factor > 0.0 && factor <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"partial_rotary_factor\" must be in (0, 1], found ",
        value->dump()));
  }
  return factor;
}

// A list of rope divisors (longrope's short_factor / long_factor): exactly
// `size` positive numbers.
absl::StatusOr<std::vector<double>> RopeFactorList(const Json& params,
                                                   absl::string_view where,
                                                   absl::string_view key,
                                                   int64_t size) {
  const Json* value = Find(params, key);
  if (value == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "rope_type \"longrope\" requires \"", key, "\""));
  }
  if (!value->is_array() || static_cast<int64_t>(value->size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "\"", key, "\" must be a list of ", size,
                     " numbers (rotary dims / 2), found ",
                     value->is_array() ? absl::StrCat(value->size(), " entries")
                                       : TypeName(*value)));
  }
  std::vector<double> out;
  out.reserve(value->size());
  for (const Json& item : *value) {
    ASSIGN_OR_RETURN(const double v, AsDouble(item, key));
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "\"", key, "\" holds ", item.dump(),
                       ", not a positive number"));
    }
    out.push_back(v);
  }
  return out;
}

// transformers' get_mscale(scale, mscale) of YaRN.
double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// RoPE: transformers 5 writes `rope_parameters` (theta inside, rope_type);
// transformers 4 writes top-level `rope_theta` and an optional `rope_scaling`
// ({"type" | "rope_type": ..., "factor": ...}). `rope_parameters` wins.
// `config` holds the fields parsed before (arch, head_dim,
// max_position_embeddings).
absl::StatusOr<RopeConfig> ParseRope(const Json& root,
                                     const ModelConfig& config) {
  RopeConfig rope;
  const bool phi3 = config.arch == Architecture::kPhi3;
  ASSIGN_OR_RETURN(rope.theta,
                   OptionalPositiveDouble(root, "rope_theta", 10000.0));

  const Json* params = Find(root, "rope_parameters");
  absl::string_view params_key = "rope_parameters";
  if (params == nullptr) {
    params = Find(root, "rope_scaling");
    params_key = "rope_scaling";
  }
  if (params != nullptr && !params->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", params_key,
                     "\" must be an object, found ", TypeName(*params)));
  }
  if (params != nullptr) {
    for (const auto& item : params->items()) {
      if (item.value().is_object()) {
        // {"full_attention": {...}, "sliding_attention": {...}}.
        return absl::UnimplementedError(
            absl::StrCat("per-layer-type ", params_key, " (key \"", item.key(),
                         "\") are not supported yet"));
      }
    }
  }
  const std::string where =
      params != nullptr ? absl::StrCat(params_key, ": ") : std::string();

  // The rotated dims. Only Phi-3's attention rotates part of a head
  // (transformers' Llama and Qwen attention would fail on a shorter cos).
  ASSIGN_OR_RETURN(const double partial, PartialRotaryFactor(root, params));
  if (partial != 1.0 && !phi3) {
    return absl::UnimplementedError(
        absl::StrCat("partial_rotary_factor ", partial,
                     " is not supported yet for model_type \"",
                     config.model_type, "\" (only 1.0; phi3 takes any)"));
  }
  rope.rotary_dim =
      static_cast<int64_t>(static_cast<double>(config.head_dim) * partial);
  if (rope.rotary_dim < 2 || rope.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partial_rotary_factor ", partial, " of head_dim ", config.head_dim,
        " rotates ", rope.rotary_dim, " dims; RoPE needs an even number >= 2"));
  }
  const int64_t half = rope.rotary_dim / 2;
  if (params == nullptr) return rope;

  ASSIGN_OR_RETURN(rope.theta,
                   OptionalPositiveDouble(*params, "rope_theta", rope.theta));

  const Json* type = Find(*params, "rope_type");
  if (type == nullptr) type = Find(*params, "type");
  std::string rope_type = "default";
  if (type != nullptr) {
    if (!type->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "rope_type must be a string, found ", type->dump()));
    }
    rope_type = type->get<std::string>();
  } else if (params_key == "rope_scaling") {
    // transformers 4 always names the type; a bare {"factor": 8} is not a
    // config it would accept.
    return absl::InvalidArgumentError(
        "config key \"rope_scaling\" has no \"rope_type\" (or \"type\")");
  }
  if (phi3) {
    // Phi3Config reads its older spellings as LongRoPE and takes nothing
    // else.
    if (rope_type == "su" || rope_type == "yarn") rope_type = "longrope";
    if (rope_type != "default" && rope_type != "longrope") {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "phi3 takes rope_type \"default\" or "
                       "\"longrope\", found \"",
                       rope_type, "\""));
    }
  }

  auto positive = [&](const Json& value,
                      absl::string_view key) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const double v, AsDouble(value, key));
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "\"", key, "\" must be positive, found ", value.dump()));
    }
    return v;
  };
  auto required = [&](absl::string_view key) -> absl::StatusOr<double> {
    const Json* value = Find(*params, key);
    if (value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "rope_type \"", rope_type, "\" requires \"", key, "\""));
    }
    return positive(*value, key);
  };
  // An optional positive number; nullopt when absent or null.
  auto optional =
      [&](absl::string_view key) -> absl::StatusOr<std::optional<double>> {
    const Json* value = Find(*params, key);
    if (value == nullptr) return std::optional<double>();
    ASSIGN_OR_RETURN(const double v, positive(*value, key));
    return std::optional<double>(v);
  };
  // original_max_position_embeddings as transformers' standardize_rope_params
  // sets it for llama3, yarn and longrope: phi3's top-level key (its config
  // class always has one, default 4096) wins; otherwise rope parameters', the
  // top-level key, then max_position_embeddings (when `fallback`).
  auto original_max = [&](bool fallback) -> absl::StatusOr<int64_t> {
    constexpr absl::string_view kKey = "original_max_position_embeddings";
    const Json* top = Find(root, kKey);
    const Json* value = phi3 ? top : Find(*params, kKey);
    if (value == nullptr) value = phi3 ? Find(*params, kKey) : top;
    if (value == nullptr && phi3) return int64_t{4096};
    if (value == nullptr) {
      if (fallback) return config.max_position_embeddings;
      return absl::InvalidArgumentError(absl::StrCat(
          where, "rope_type \"", rope_type, "\" requires \"", kKey, "\""));
    }
    ASSIGN_OR_RETURN(const int64_t v, AsInt(*value, kKey));
    if (v <= 0 || v > kMaxPositionEmbeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "\"", kKey, "\" must be in [1, ",
                       kMaxPositionEmbeddings, "], found ", v));
    }
    return v;
  };

  // "factor", or, when absent or null, the ratio of the extended to the
  // original context (DeepSeek-V3's spelling; yarn and longrope).
  auto factor_or_ratio = [&]() -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const std::optional<double> factor, optional("factor"));
    if (factor.has_value()) return *factor;
    return static_cast<double>(config.max_position_embeddings) /
           static_cast<double>(rope.original_max_position);
  };
  if (rope_type == "default") {
    rope.scaling = RopeScaling::kNone;
  } else if (rope_type == "linear") {
    rope.scaling = RopeScaling::kLinear;
    ASSIGN_OR_RETURN(rope.factor, required("factor"));
  } else if (rope_type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    ASSIGN_OR_RETURN(rope.factor, required("factor"));
    ASSIGN_OR_RETURN(rope.low_freq_factor, required("low_freq_factor"));
    ASSIGN_OR_RETURN(rope.high_freq_factor, required("high_freq_factor"));
    ASSIGN_OR_RETURN(rope.original_max_position,
                     original_max(/*fallback=*/false));
    // The smooth ramp divides by (high - low).
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "llama3 high_freq_factor (", rope.high_freq_factor,
          ") must exceed low_freq_factor (", rope.low_freq_factor, ")"));
    }

  } else if (rope_type == "yarn") {
    rope.scaling = RopeScaling::kYarn;
    if (rope.theta == 1.0) {
      // The correction range divides by ln(theta).
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rope_type \"yarn\" needs rope_theta != 1"));
    }
    ASSIGN_OR_RETURN(rope.original_max_position,
                     original_max(/*fallback=*/true));
    // "factor" is required; an explicit null means the ratio of the
    // extended to the original context (DeepSeek-V3's spelling).
    if (!params->contains("factor")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rope_type \"yarn\" requires \"factor\""));
    }
    ASSIGN_OR_RETURN(rope.factor, factor_or_ratio());
    ASSIGN_OR_RETURN(const std::optional<double> attention,
                     optional("attention_factor"));
    // mscale / mscale_all_dim count only when both are non-zero (a 0 is
    // transformers' falsy "unset").
    const Json* mscale = Find(*params, "mscale");
    const Json* mscale_all_dim = Find(*params, "mscale_all_dim");
    double m = 0, m_all = 0;
    if (mscale != nullptr) {
      ASSIGN_OR_RETURN(m, AsDouble(*mscale, "mscale"));
    }
    if (mscale_all_dim != nullptr) {
      ASSIGN_OR_RETURN(m_all, AsDouble(*mscale_all_dim, "mscale_all_dim"));
    }
    if (attention.has_value()) {
      rope.attention_factor = *attention;
    } else if (m != 0 && m_all != 0) {
      rope.attention_factor =
          YarnMscale(rope.factor, m) / YarnMscale(rope.factor, m_all);
    } else {
      rope.attention_factor = YarnMscale(rope.factor, 1.0);
    }
    // `beta_fast or 32`, `beta_slow or 1`: 0 is unset too.
    auto beta = [&](absl::string_view key,
                    double fallback) -> absl::StatusOr<double> {
      const Json* value = Find(*params, key);
      if (value == nullptr) return fallback;
      ASSIGN_OR_RETURN(const double v, AsDouble(*value, key));
      if (v == 0.0) return fallback;
      return positive(*value, key);
    };
    ASSIGN_OR_RETURN(rope.beta_fast, beta("beta_fast", 32.0));
    ASSIGN_OR_RETURN(rope.beta_slow, beta("beta_slow", 1.0));
    ASSIGN_OR_RETURN(rope.truncate, OptionalBool(*params, "truncate", true));
    if (!std::isfinite(rope.attention_factor) || !(rope.attention_factor > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "yarn attention factor ", rope.attention_factor,
                       " is not a positive number"));
    }
  } else if (rope_type == "dynamic") {
    rope.scaling = RopeScaling::kDynamic;
    ASSIGN_OR_RETURN(rope.factor, required("factor"));
    // transformers compares each length with config.max_position_embeddings
    // (the checkpoint's; --max-model-len lowers only the served context).
    rope.original_max_position = config.max_position_embeddings;
    if (rope.rotary_dim <= 2) {
      // The theta exponent is dim / (dim - 2).
      return absl::InvalidArgumentError(absl::StrCat(
          where, "rope_type \"dynamic\" needs more than 2 rotary dims, found ",
          rope.rotary_dim));
    }
  } else if (rope_type == "longrope") {
    rope.scaling = RopeScaling::kLongRope;
    ASSIGN_OR_RETURN(rope.original_max_position,
                     original_max(/*fallback=*/true));
    ASSIGN_OR_RETURN(rope.short_factor,
                     RopeFactorList(*params, where, "short_factor", half));
    ASSIGN_OR_RETURN(rope.long_factor,
                     RopeFactorList(*params, where, "long_factor", half));
    ASSIGN_OR_RETURN(rope.factor, factor_or_ratio());
    ASSIGN_OR_RETURN(const std::optional<double> attention,
                     optional("attention_factor"));
    if (attention.has_value()) {
      rope.attention_factor = *attention;
    } else if (rope.factor <= 1.0) {
      rope.attention_factor = 1.0;
    } else if (rope.original_max_position == 1) {
      // ln(1) = 0 would divide by zero.
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          "longrope needs original_max_position_embeddings > 1 for its "
          "attention factor"));
    } else {
      rope.attention_factor = std::sqrt(
          1.0 + std::log(rope.factor) /
                    std::log(static_cast<double>(rope.original_max_position)));
    }
  } else {
    return absl::UnimplementedError(
        absl::StrCat("rope_type \"", rope_type, "\" is not supported yet"));
  }
  return rope;
}

// The context a rope scaling extends a model to, as vLLM derives it
// (_get_and_verify_max_len): dynamic max_position_embeddings * factor, yarn
// original_max_position_embeddings * factor; never below the declared
// max_position_embeddings. Other types keep max_position_embeddings.
absl::StatusOr<int64_t> ScaledContext(const ModelConfig& config) {
  const RopeConfig& r = config.rope;
  double scaled = 0;
  if (r.scaling == RopeScaling::kDynamic) {
    scaled = static_cast<double>(config.max_position_embeddings) * r.factor;
  } else if (r.scaling == RopeScaling::kYarn) {
    scaled = static_cast<double>(r.original_max_position) * r.factor;
  }
  if (!(scaled > static_cast<double>(config.max_position_embeddings))) {
    return config.max_position_embeddings;
  }
  if (scaled > static_cast<double>(kMaxPositionEmbeddings)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rope scaling extends the context to ", scaled,
        " positions, more than the ", kMaxPositionEmbeddings, " supported"));
  }
  return static_cast<int64_t>(scaled);
}
// config.json's sliding_window: `fallback` when absent, 0 (full attention)
// when null.
absl::StatusOr<int64_t> SlidingWindowValue(const Json& root, int64_t fallback) {
  auto it = root.find("sliding_window");
  if (it == root.end()) return fallback;
  if (it->is_null()) return 0;
  ASSIGN_OR_RETURN(const int64_t w, AsInt(*it, "sliding_window"));
  if (w < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"sliding_window\" must be non-negative, found ", w));
  }
  return w;
}

// Qwen2Config/Qwen3Config: sliding_window only counts when use_sliding_window
// is true (default false, sliding_window default 4096); layer_types then says
// which layers slide, or, when absent, layers i >= max_window_layers (default
// 28) do.
absl::Status ParseQwenSlidingWindow(const Json& root, ModelConfig* config) {
  ASSIGN_OR_RETURN(const bool use_sliding,
                   OptionalBool(root, "use_sliding_window", false));
  int64_t window = 0;
  if (use_sliding) {
    ASSIGN_OR_RETURN(window, SlidingWindowValue(root, 4096));
  }
  const Json* layer_types = Find(root, "layer_types");
  if (layer_types != nullptr) {
    if (!layer_types->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"layer_types\" must be a list, found ",
                       TypeName(*layer_types)));
    }
    if (static_cast<int64_t>(layer_types->size()) != config->num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"layer_types\" has ", layer_types->size(),
          " entries but num_hidden_layers is ", config->num_layers));
    }
    for (int64_t i = 0; i < config->num_layers; ++i) {
      const Json& type = (*layer_types)[i];
      if (type == "sliding_attention") {
        config->sliding_window_per_layer[i] = window;
      } else if (type != "full_attention") {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"layer_types\"[", i,
                         "]: unsupported layer type ", type.dump()));
      }
    }
    return absl::OkStatus();
  }
  if (window == 0) return absl::OkStatus();
  int64_t max_window_layers = 28;
  if (const Json* v = Find(root, "max_window_layers")) {
    ASSIGN_OR_RETURN(max_window_layers, AsInt(*v, "max_window_layers"));
  }
  for (int64_t i = std::max<int64_t>(max_window_layers, 0);
       i < config->num_layers; ++i) {
    config->sliding_window_per_layer[i] = window;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Mixtures of experts (mixtral, qwen3_moe, qwen2_moe).

// What the transformers config classes default to.
struct MoeDefaults {
  int64_t num_experts = 8;
  int64_t experts_per_token = 2;
  // moe_intermediate_size's default; 0: the experts use intermediate_size
  // (mixtral, which has no moe_intermediate_size).
  int64_t expert_intermediate_size = 0;
  // shared_expert_intermediate_size's default; 0: no shared expert.
  int64_t shared_expert_intermediate_size = 0;
  // mixtral always renormalises (norm_topk_prob is not read).
  bool always_norm_topk = false;
  // qwen: decoder_sparse_step and mlp_only_layers pick the MoE layers;
  // mixtral: every layer is one.
  bool sparse_layer_keys = false;
};

// num_local_experts (MixtralConfig) and num_experts (the Qwen classes, whose
// attribute_map also accepts the other spelling): either key, and when both
// are present they must agree.
absl::StatusOr<int64_t> NumExperts(const Json& root, int64_t fallback) {
  const Json* local = Find(root, "num_local_experts");
  const Json* plain = Find(root, "num_experts");
  int64_t n = fallback;
  if (local != nullptr) {
    ASSIGN_OR_RETURN(n, AsInt(*local, "num_local_experts"));
  }
  if (plain != nullptr) {
    ASSIGN_OR_RETURN(const int64_t m, AsInt(*plain, "num_experts"));
    if (local != nullptr && m != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("config keys \"num_local_experts\" (", n,
                       ") and \"num_experts\" (", m, ") disagree"));
    }
    n = m;
  }
  const absl::string_view key =
      plain != nullptr ? "num_experts" : "num_local_experts";
  if (n < 1 || n > kMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"", key, "\" must be in [1, ", kMaxExperts,
                     "], found ", n));
  }
  return n;
}

absl::Status ParseMoeHParams(const Json& root, const MoeDefaults& d,
                             ModelConfig* config) {
  MoeHParams& m = config->moe;
  ASSIGN_OR_RETURN(m.num_experts, NumExperts(root, d.num_experts));
  ASSIGN_OR_RETURN(
      m.experts_per_token,
      OptionalPositiveInt(root, "num_experts_per_tok", d.experts_per_token));
  if (m.experts_per_token > m.num_experts ||
      m.experts_per_token > kMaxExpertsPerToken) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"num_experts_per_tok\" is ",
                     m.experts_per_token, ": more than the ", m.num_experts,
                     " experts or the ", kMaxExpertsPerToken, " supported"));
  }
  if (d.expert_intermediate_size > 0) {
    ASSIGN_OR_RETURN(m.expert_intermediate_size,
                     OptionalPositiveInt(root, "moe_intermediate_size",
                                         d.expert_intermediate_size));
  } else {
    m.expert_intermediate_size = config->intermediate_size;
  }
  if (d.shared_expert_intermediate_size > 0) {
    ASSIGN_OR_RETURN(
        m.shared_expert_intermediate_size,
        OptionalPositiveInt(root, "shared_expert_intermediate_size",
                            d.shared_expert_intermediate_size));
  }
  if (d.always_norm_topk) {
    m.norm_topk_prob = true;
  } else {
    ASSIGN_OR_RETURN(m.norm_topk_prob,
                     OptionalBool(root, "norm_topk_prob", false));
  }
  // Per-layer tables hold num_layers entries; every size above is bounded
  // so that the expert tables' element counts fit (weights.h).
  using KeyValue = std::pair<const char*, int64_t>;
  for (const KeyValue& kv :
       {KeyValue{"moe_intermediate_size", m.expert_intermediate_size},
        KeyValue{"shared_expert_intermediate_size",
                 m.shared_expert_intermediate_size}}) {
    const auto& [key, value] = kv;
    if (value > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"", key, "\" is ", value,
                       ", more than the ", int64_t{1} << 24, " supported"));
    }
  }
  m.sparse_layers.assign(config->num_layers, 1);
  if (!d.sparse_layer_keys) return absl::OkStatus();
  // Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer l is MoE unless it is
  // in mlp_only_layers, and only when (l + 1) % decoder_sparse_step == 0.
  ASSIGN_OR_RETURN(const int64_t step,
                   OptionalPositiveInt(root, "decoder_sparse_step", 1));
  for (int64_t l = 0; l < config->num_layers; ++l) {
    m.sparse_layers[l] = (l + 1) % step == 0 ? 1 : 0;
  }
  if (const Json* only = Find(root, "mlp_only_layers")) {
    if (!only->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"mlp_only_layers\" must be a list, found ",
                       TypeName(*only)));
    }
    for (size_t i = 0; i < only->size(); ++i) {
      ASSIGN_OR_RETURN(const int64_t l, AsInt((*only)[i], "mlp_only_layers"));
      if (l < 0 || l >= config->num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"mlp_only_layers\"[", i, "] is ", l,
                         ", not a layer index (num_hidden_layers is ",
                         config->num_layers, ")"));
      }
      m.sparse_layers[l] = 0;
    }
  }
  return absl::OkStatus();
}

constexpr ArchitectureConfig kArchitectures[] = {
    {"llama", Architecture::kLlama, &ParseLlamaHParams},
    {"mistral", Architecture::kMistral, &ParseMistralHParams},
    {"qwen2", Architecture::kQwen2, &ParseQwen2HParams},
    {"qwen3", Architecture::kQwen3, &ParseQwen3HParams},
    {"phi3", Architecture::kPhi3, &ParsePhi3HParams},
    {"gemma", Architecture::kGemma, &ParseGemmaHParams,
     /*own_activation_and_rope=*/true},
    {"gemma2", Architecture::kGemma2, &ParseGemma2HParams,
     /*own_activation_and_rope=*/true},
    {"gemma3_text", Architecture::kGemma3, &ParseGemma3HParams,
     /*own_activation_and_rope=*/true},
    // Mixtures of experts.
    {"mixtral", Architecture::kMixtral, &ParseMixtralHParams},
    {"qwen3_moe", Architecture::kQwen3Moe, &ParseQwen3MoeHParams},
    {"qwen2_moe", Architecture::kQwen2Moe, &ParseQwen2MoeHParams},
};

// The Hugging Face classes (config.json's `architectures`) Tessera runs, and
// the model_type each one is. A checkpoint is dispatched by its class first,
// as transformers' AutoModelForCausalLM resolves it, with model_type as the
// fallback for configs that name no class.
struct ArchitectureClass {
  absl::string_view hf_class;
  absl::string_view model_type;
};
constexpr ArchitectureClass kArchitectureClasses[] = {
    {"LlamaForCausalLM", "llama"},        {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},        {"Qwen3ForCausalLM", "qwen3"},
    {"Phi3ForCausalLM", "phi3"},          {"GemmaForCausalLM", "gemma"},
    {"Gemma2ForCausalLM", "gemma2"},      {"Gemma3ForCausalLM", "gemma3_text"},
    {"MixtralForCausalLM", "mixtral"},    {"Qwen2MoeForCausalLM", "qwen2_moe"},
    {"Qwen3MoeForCausalLM", "qwen3_moe"},
};

// Known, and refused with the reason rather than as unknown: the multimodal
// Gemma 3 (its text part is a gemma3_text model, but under text_config and
// with tensor names of another prefix).
absl::Status RefuseMultimodalGemma3() {
  return absl::UnimplementedError(
      "model_type \"gemma3\" (Gemma3ForConditionalGeneration, text and "
      "vision) is not supported: its text_config and prefixed tensor names "
      "are not read; a Gemma3ForCausalLM checkpoint (model_type "
      "\"gemma3_text\") runs");
}

// model_types whose names suggest a supported one but whose architecture is
// another: refused with the reason, not as merely unknown.
struct KnownUnsupported {
  absl::string_view model_type;
  absl::string_view why;
};
constexpr KnownUnsupported kKnownUnsupported[] = {
    {"phi3small",
     "Phi-3-small is not the phi3 architecture (LayerNorm, a GeGLU-style "
     "MLP, block-sparse attention, muP scaling)"},
};

absl::StatusOr<const ArchitectureConfig*> FindArchitectureConfig(
    absl::string_view model_type) {
  if (model_type == "gemma3") return RefuseMultimodalGemma3();
  std::vector<absl::string_view> names;
  for (const ArchitectureConfig& a : kArchitectures) {
    if (a.model_type == model_type) return &a;
    names.push_back(a.model_type);
  }
  for (const KnownUnsupported& k : kKnownUnsupported) {
    if (k.model_type == model_type) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported model_type \"", model_type, "\": ", k.why,
                       " (supported: ", absl::StrJoin(names, ", "), ")"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported model_type \"", model_type,
                   "\" (supported: ", absl::StrJoin(names, ", "), ")"));
}

// The model_type a config is run as: its `architectures` class when Tessera
// knows it (a model_type that names another architecture is a mismatch),
// else its model_type — for an unknown class only when the class is still a
// causal LM (a sequence classifier or a multimodal class is not one).
absl::StatusOr<std::string> ResolveModelType(const Json& root) {
  std::optional<std::string> model_type;
  if (const Json* v = Find(root, "model_type")) {
    if (!v->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"model_type\" must be a string, found ", v->dump()));
    }
    model_type = v->get<std::string>();
  }
  std::optional<std::string> hf_class;
  if (const Json* v = Find(root, "architectures")) {
    if (!v->is_array() || (!v->empty() && !(*v)[0].is_string())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config key \"architectures\" must be a list of class names, "
          "found ",
          v->dump().substr(0, 200)));
    }
    if (!v->empty()) hf_class = (*v)[0].get<std::string>();
  }
  if (!hf_class.has_value()) {
    if (!model_type.has_value()) {
      return absl::InvalidArgumentError(
          "config is missing required key \"model_type\" (and names no "
          "\"architectures\")");
    }
    return *model_type;
  }
  if (*hf_class == "Gemma3ForConditionalGeneration") {
    return RefuseMultimodalGemma3();
  }
  for (const ArchitectureClass& c : kArchitectureClasses) {
    if (c.hf_class != *hf_class) continue;
    if (model_type.has_value() && *model_type != c.model_type) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json's architectures names ", *hf_class, " (model_type \"",
          c.model_type, "\") but its model_type is \"", *model_type,
          "\": the config does not describe one architecture"));
    }
    return std::string(c.model_type);
  }
  const bool causal_lm = absl::EndsWith(*hf_class, "ForCausalLM") ||
                         absl::EndsWith(*hf_class, "LMHeadModel");
  if (!causal_lm || !model_type.has_value()) {
    std::vector<absl::string_view> names;
    for (const ArchitectureClass& c : kArchitectureClasses) {
      names.push_back(c.hf_class);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture \"", hf_class->substr(0, 100),
                     "\"", causal_lm ? "" : " (not a causal language model)",
                     " (supported: ", absl::StrJoin(names, ", "), ")"));
  }
  return *model_type;
}

absl::StatusOr<ModelConfig> ParseRoot(const Json& root) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json must hold a JSON object, found ", TypeName(root)));
  }
  ModelConfig config;

  ASSIGN_OR_RETURN(config.model_type, ResolveModelType(root));
  ASSIGN_OR_RETURN(const ArchitectureConfig* arch,
                   FindArchitectureConfig(config.model_type));
  config.arch = arch->arch;

  // Quantized weights change every tensor's meaning: read (or refuse) them
  // before anything else.
  RETURN_IF_ERROR(ParseQuantization(root, &config.quant));

  ASSIGN_OR_RETURN(config.vocab_size, RequiredPositiveInt(root, "vocab_size"));
  ASSIGN_OR_RETURN(config.hidden_size,
                   RequiredPositiveInt(root, "hidden_size"));
  ASSIGN_OR_RETURN(config.intermediate_size,
                   RequiredPositiveInt(root, "intermediate_size"));
  ASSIGN_OR_RETURN(config.num_layers,
                   RequiredPositiveInt(root, "num_hidden_layers"));
  // Per-layer tables are sized from this before any weight is read: a corrupt
  // value must fail here, not as std::bad_alloc.
  constexpr int64_t kMaxLayers = int64_t{1} << 16;
  if (config.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"num_hidden_layers\" is ", config.num_layers,
                     ", more than the ", kMaxLayers, " supported"));
  }
  ASSIGN_OR_RETURN(config.num_heads,
                   RequiredPositiveInt(root, "num_attention_heads"));
  ASSIGN_OR_RETURN(config.max_position_embeddings,
                   RequiredPositiveInt(root, "max_position_embeddings"));
  // Positions are int32 in every kernel, and the KV pool and step buffers are
  // sized from the context: a corrupt value must fail here, not overflow
  // there.
  if (config.max_position_embeddings > kMaxPositionEmbeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"max_position_embeddings\" is ",
                     config.max_position_embeddings, ", more than the ",
                     kMaxPositionEmbeddings, " supported"));
  }
  ASSIGN_OR_RETURN(
      config.num_kv_heads,
      OptionalPositiveInt(root, "num_key_value_heads", config.num_heads));
  if (config.num_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_attention_heads (", config.num_heads,
                     ") must be a multiple of num_key_value_heads (",
                     config.num_kv_heads, ")"));
  }
  if (Find(root, "head_dim") != nullptr) {
    ASSIGN_OR_RETURN(config.head_dim, OptionalPositiveInt(root, "head_dim", 0));
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden_size (", config.hidden_size,
                       ") is not divisible by num_attention_heads (",
                       config.num_heads, ") and config has no \"head_dim\""));
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  ASSIGN_OR_RETURN(config.rms_norm_eps,
                   OptionalPositiveDouble(root, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(config.initializer_range,
                   OptionalPositiveDouble(root, "initializer_range", 0.02));

  if (!arch->own_activation_and_rope) {
    ASSIGN_OR_RETURN(const std::optional<std::string> act,
                     OptionalString(root, "hidden_act"));
    if (act.has_value() && *act != "silu") {
      return absl::InvalidArgumentError(absl::StrCat(
          "hidden_act \"", *act, "\" is not supported (only \"silu\")"));
    }
    ASSIGN_OR_RETURN(config.rope, ParseRope(root, config));
  }

  ASSIGN_OR_RETURN(config.tie_word_embeddings,
                   OptionalBool(root, "tie_word_embeddings", false));

  RETURN_IF_ERROR(arch->parse_hparams(root, &config));
  ASSIGN_OR_RETURN(config.max_position_embeddings, ScaledContext(config));

  if (const Json* bos = Find(root, "bos_token_id")) {
    ASSIGN_OR_RETURN(config.bos_token_id, AsInt(*bos, "bos_token_id"));
    // A negative bos_token_id means none (as -1 does here).
    if (config.bos_token_id < 0) config.bos_token_id = -1;
    RETURN_IF_ERROR(CheckTokenIdRange(config.bos_token_id, "bos_token_id",
                                      config.vocab_size));
  }
  RETURN_IF_ERROR(AppendTokenIds(Find(root, "eos_token_id"), "eos_token_id",
                                 config.vocab_size, &config.eos_token_ids));

  // transformers 5 renamed torch_dtype to dtype.
  ASSIGN_OR_RETURN(std::optional<std::string> dtype,
                   OptionalString(root, "dtype"));
  if (!dtype.has_value()) {
    ASSIGN_OR_RETURN(dtype, OptionalString(root, "torch_dtype"));
  }
  if (dtype.has_value()) config.torch_dtype = *dtype;
  return config;
}

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed JSON: ", e.what()));
  }
}

// config.json and generation_config.json are small; anything larger is not
// one. Read without a plain open(): a FIFO in their place must not hang us.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadRegularFile(path, kMaxConfigBytes);
}

}  // namespace

// The architectures' own fields (ArchitectureConfig::parse_hparams). Each
// starts from full attention in every layer.

absl::Status ParseLlamaHParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  LlamaHParams& h = config->llama;
  ASSIGN_OR_RETURN(h.attention_bias,
                   OptionalBool(root, "attention_bias", false));
  h.attention_out_bias = h.attention_bias;
  ASSIGN_OR_RETURN(h.mlp_bias, OptionalBool(root, "mlp_bias", false));
  return absl::OkStatus();
}

absl::Status ParseMistralHParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  // MistralConfig defaults sliding_window to 4096 when the key is absent;
  // null means full attention.
  ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 4096));
  config->sliding_window_per_layer.assign(config->num_layers, window);
  return absl::OkStatus();
}

absl::Status ParseQwen2HParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  config->llama.attention_bias = true;  // q/k/v always; o_proj never.
  config->llama.attention_out_bias = false;
  return ParseQwenSlidingWindow(root, config);
}

absl::Status ParseQwen3HParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  LlamaHParams& h = config->llama;
  ASSIGN_OR_RETURN(h.attention_bias,
                   OptionalBool(root, "attention_bias", false));
  h.attention_out_bias = h.attention_bias;
  h.qk_norm = true;
  return ParseQwenSlidingWindow(root, config);
}

absl::Status ParsePhi3HParams(const Json& root, ModelConfig* config) {
  // Phi3Config: sliding_window defaults to None (full attention); when set,
  // every layer slides (transformers' sliding-window causal mask).
  ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 0));
  config->sliding_window_per_layer.assign(config->num_layers, window);
  // Phi3Config's default, where ParseRoot assumed Llama's.
  if (Find(root, "rms_norm_eps") == nullptr) config->rms_norm_eps = 1e-5;
  // No biases (qkv_proj, o_proj, gate_up_proj, down_proj have none).
  config->llama = LlamaHParams();
  // Phi3ForCausalLM.prepare_inputs_for_generation: the cache is dropped when
  // the input first reaches original_max_position_embeddings + 1 tokens.
  // Only LongRoPE rotates differently past it.
  if (config->rope.scaling == RopeScaling::kLongRope) {
    config->recompute_at_length = config->rope.original_max_position;
  }
  return absl::OkStatus();
}

namespace {

// A Gemma activation name (config key `key`).
absl::StatusOr<HiddenActivation> GemmaActivation(const std::string& name,
                                                 absl::string_view key) {
  if (name == "gelu_pytorch_tanh") return HiddenActivation::kGeluTanh;
  if (name == "silu" || name == "swish") return HiddenActivation::kSilu;
  if (name == "gelu") {
    return absl::UnimplementedError(absl::StrCat(
        "config key \"", key,
        "\" is \"gelu\": exact (erf) GELU is not supported yet (only "
        "\"gelu_pytorch_tanh\" and \"silu\")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config key \"", key, "\": unsupported activation \"", name,
                   "\" (supported: gelu_pytorch_tanh, silu)"));
}

// A logit soft cap: `fallback` when absent, 0 (none) when null, else a
// positive finite number.
absl::StatusOr<double> SoftcapValue(const Json& root, absl::string_view key,
                                    double fallback) {
  auto it = root.find(std::string(key));
  if (it == root.end()) return fallback;
  if (it->is_null()) return 0.0;
  ASSIGN_OR_RETURN(const double v, AsDouble(*it, key));
  if (!(v > 0) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key \"", key, "\" must be positive or null, found ", v));
  }
  return v;
}

// What the three Gemmas share: tied embeddings and head_dim 256 by default
// (transformers' defaults, unlike the Llama family's), biases, causal
// attention only, full attention everywhere until the layer types say
// otherwise.
absl::Status ParseGemmaCommon(const Json& root, ModelConfig* config) {
  const int64_t n = config->num_layers;
  config->sliding_window_per_layer.assign(n, 0);
  GemmaHParams& g = config->gemma;
  g = GemmaHParams();
  g.sliding_layer.assign(n, false);
  ASSIGN_OR_RETURN(config->tie_word_embeddings,
                   OptionalBool(root, "tie_word_embeddings", true));
  if (Find(root, "head_dim") == nullptr) config->head_dim = 256;
  ASSIGN_OR_RETURN(g.attention_bias,
                   OptionalBool(root, "attention_bias", false));
  ASSIGN_OR_RETURN(const bool bidirectional,
                   OptionalBool(root, "use_bidirectional_attention", false));
  if (bidirectional) {
    return absl::UnimplementedError(
        "config key \"use_bidirectional_attention\" is true (an embedding "
        "model): only causal attention is supported");
  }
  return absl::OkStatus();
}

// Gemma 2 and 3: the attention scale, the soft caps, the sandwich norms, and
// which layers slide: layer_types when given (each "sliding_attention" or
// "full_attention"), else layer i slides unless (i + 1) % `pattern` == 0
// (transformers 5's derivation: gemma2 pattern 2 from layer 0, gemma3
// sliding_window_pattern). A sliding layer sees sliding_window keys
// (default 4096; null: all), HF's mask: keys (p - window, p].
absl::Status ParseGemmaSandwich(const Json& root, int64_t pattern,
                                double attn_softcap, double final_softcap,
                                ModelConfig* config) {
  GemmaHParams& g = config->gemma;
  g.sandwich_norms = true;
  ASSIGN_OR_RETURN(g.query_pre_attn_scalar,
                   OptionalPositiveDouble(root, "query_pre_attn_scalar", 256));
  ASSIGN_OR_RETURN(g.attn_logit_softcapping,
                   SoftcapValue(root, "attn_logit_softcapping", attn_softcap));
  ASSIGN_OR_RETURN(
      g.final_logit_softcapping,
      SoftcapValue(root, "final_logit_softcapping", final_softcap));
  ASSIGN_OR_RETURN(const std::optional<std::string> act,
                   OptionalString(root, "hidden_activation"));
  if (act.has_value()) {
    ASSIGN_OR_RETURN(g.activation, GemmaActivation(*act, "hidden_activation"));
  }
  ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 4096));
  const int64_t n = config->num_layers;
  const Json* layer_types = Find(root, "layer_types");
  if (layer_types != nullptr) {
    if (!layer_types->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"layer_types\" must be a list, found ",
                       TypeName(*layer_types)));
    }
    if (static_cast<int64_t>(layer_types->size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key \"layer_types\" has ", layer_types->size(),
                       " entries but num_hidden_layers is ", n));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    bool sliding = (i + 1) % pattern != 0;
    if (layer_types != nullptr) {
      const Json& type = (*layer_types)[i];
      if (type == "sliding_attention") {
        sliding = true;
      } else if (type == "full_attention") {
        sliding = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("config key \"layer_types\"[", i,
                         "]: unsupported layer type ", type.dump()));
      }
    }
    g.sliding_layer[i] = sliding;
    config->sliding_window_per_layer[i] = sliding ? window : 0;
  }
  return absl::OkStatus();
}

// Gemma 3's two RoPEs. transformers 5: rope_parameters keyed by layer type
// ({"full_attention": {...}, "sliding_attention": {...}}, each read as a
// RoPE of its own; a missing one is the default RoPE), with rope_theta
// (default 1e6) and rope_local_base_freq (default 1e4) as their thetas when
// they name none. transformers 4: rope_theta and rope_scaling for the global
// layers, the default RoPE at rope_local_base_freq for the local ones.
absl::Status ParseGemma3Rope(const Json& root, ModelConfig* config) {
  RETURN_IF_ERROR(CheckPartialRotary(root, ""));
  ASSIGN_OR_RETURN(const double global_theta,
                   OptionalPositiveDouble(root, "rope_theta", 1e6));
  ASSIGN_OR_RETURN(const double local_theta,
                   OptionalPositiveDouble(root, "rope_local_base_freq", 1e4));
  const Json* params = Find(root, "rope_parameters");
  if (params == nullptr) {
    Json full = Json::object();
    full["rope_theta"] = global_theta;
    if (const Json* scaling = Find(root, "rope_scaling")) {
      full["rope_scaling"] = *scaling;
    }
    ASSIGN_OR_RETURN(config->rope, ParseRope(full, *config));
    config->gemma.rope_local = RopeConfig();
    config->gemma.rope_local.theta = local_theta;
    return absl::OkStatus();
  }
  if (!params->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key \"rope_parameters\" must be an object, "
                     "found ",
                     TypeName(*params)));
  }
  for (const auto& item : params->items()) {
    if (item.key() != "full_attention" && item.key() != "sliding_attention") {
      return absl::InvalidArgumentError(absl::StrCat(
          "gemma3_text: config key \"rope_parameters\" must be keyed by "
          "layer type (\"full_attention\", \"sliding_attention\"), found "
          "key \"",
          item.key(), "\""));
    }
  }
  for (const bool local : {false, true}) {
    const char* key = local ? "sliding_attention" : "full_attention";
    Json one = Json::object();
    one["rope_theta"] = local ? local_theta : global_theta;
    const Json* sub = Find(*params, key);
    one["rope_parameters"] = sub != nullptr ? *sub : Json::object();
    absl::StatusOr<RopeConfig> rope = ParseRope(one, *config);
    if (!rope.ok()) {
      return Annotate(rope.status(),
                      absl::StrCat("rope_parameters[\"", key, "\"]"));
    }
    (local ? config->gemma.rope_local : config->rope) = *rope;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseGemmaHParams(const Json& root, ModelConfig* config) {
  RETURN_IF_ERROR(ParseGemmaCommon(root, config));
  // transformers 5 reads hidden_act; transformers 4 read hidden_activation
  // and ignored a legacy hidden_act ("gelu" in Gemma 1's own configs, whose
  // weights were trained with the tanh GELU): the declared hidden_activation
  // wins.
  const char* key = Find(root, "hidden_activation") != nullptr
                        ? "hidden_activation"
                        : "hidden_act";
  ASSIGN_OR_RETURN(const std::optional<std::string> act,
                   OptionalString(root, key));
  if (act.has_value()) {
    ASSIGN_OR_RETURN(config->gemma.activation, GemmaActivation(*act, key));
  }
  ASSIGN_OR_RETURN(config->rope, ParseRope(root, *config));
  return absl::OkStatus();
}

absl::Status ParseGemma2HParams(const Json& root, ModelConfig* config) {
  RETURN_IF_ERROR(ParseGemmaCommon(root, config));
  RETURN_IF_ERROR(ParseGemmaSandwich(root, /*pattern=*/2,
                                     /*attn_softcap=*/50.0,
                                     /*final_softcap=*/30.0, config));
  ASSIGN_OR_RETURN(config->rope, ParseRope(root, *config));
  return absl::OkStatus();
}

absl::Status ParseGemma3HParams(const Json& root, ModelConfig* config) {
  RETURN_IF_ERROR(ParseGemmaCommon(root, config));
  // transformers 5 saves it as the private "_sliding_window_pattern".
  ASSIGN_OR_RETURN(const int64_t saved_pattern,
                   OptionalPositiveInt(root, "_sliding_window_pattern", 6));
  ASSIGN_OR_RETURN(
      const int64_t pattern,
      OptionalPositiveInt(root, "sliding_window_pattern", saved_pattern));
  RETURN_IF_ERROR(ParseGemmaSandwich(root, pattern, /*attn_softcap=*/0.0,
                                     /*final_softcap=*/0.0, config));
  config->gemma.qk_norm = true;
  return ParseGemma3Rope(root, config);
}

absl::Status ParseMixtralHParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  // MixtralConfig: sliding_window defaults to None (full attention).
  ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 0));
  config->sliding_window_per_layer.assign(config->num_layers, window);
  MoeDefaults d;  // 8 experts, top 2, renormalised, every layer.
  d.always_norm_topk = true;
  return ParseMoeHParams(root, d, config);
}

absl::Status ParseQwen3MoeHParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  LlamaHParams& h = config->llama;
  ASSIGN_OR_RETURN(h.attention_bias,
                   OptionalBool(root, "attention_bias", false));
  h.attention_out_bias = h.attention_bias;
  h.qk_norm = true;
  // Qwen3MoeConfig has no max_window_layers: with use_sliding_window every
  // layer slides, unless layer_types says otherwise.
  if (Find(root, "layer_types") != nullptr) {
    RETURN_IF_ERROR(ParseQwenSlidingWindow(root, config));
  } else {
    ASSIGN_OR_RETURN(const bool use_sliding,
                     OptionalBool(root, "use_sliding_window", false));
    if (use_sliding) {
      ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 4096));
      config->sliding_window_per_layer.assign(config->num_layers, window);
    }
  }
  MoeDefaults d;
  d.num_experts = 128;
  d.experts_per_token = 8;
  d.expert_intermediate_size = 768;
  d.sparse_layer_keys = true;
  return ParseMoeHParams(root, d, config);
}

absl::Status ParseQwen2MoeHParams(const Json& root, ModelConfig* config) {
  config->sliding_window_per_layer.assign(config->num_layers, 0);
  // Qwen2MoeAttention: q/k/v biases when qkv_bias (default true), o_proj
  // never.
  ASSIGN_OR_RETURN(config->llama.attention_bias,
                   OptionalBool(root, "qkv_bias", true));
  config->llama.attention_out_bias = false;
  if (Find(root, "layer_types") != nullptr) {
    RETURN_IF_ERROR(ParseQwenSlidingWindow(root, config));
  } else {
    // Qwen2MoeConfig's own rule when layer_types is absent: with
    // use_sliding_window, the even layers below max_window_layers slide.
    ASSIGN_OR_RETURN(const bool use_sliding,
                     OptionalBool(root, "use_sliding_window", false));
    if (use_sliding) {
      ASSIGN_OR_RETURN(const int64_t window, SlidingWindowValue(root, 4096));
      int64_t max_window_layers = 28;
      if (const Json* v = Find(root, "max_window_layers")) {
        ASSIGN_OR_RETURN(max_window_layers, AsInt(*v, "max_window_layers"));
      }
      for (int64_t i = 0; i < config->num_layers; ++i) {
        if (i % 2 == 0 && i < max_window_layers) {
          config->sliding_window_per_layer[i] = window;
        }
      }
    }
  }
  MoeDefaults d;
  d.num_experts = 60;
  d.experts_per_token = 4;
  d.expert_intermediate_size = 1408;
  d.shared_expert_intermediate_size = 5632;
  d.sparse_layer_keys = true;
  return ParseMoeHParams(root, d, config);
}

bool QuantConfig::Quantizes(absl::string_view module) const {
  if (!quantized()) return false;
  if (module == "embed_tokens" || absl::EndsWith(module, ".embed_tokens")) {
    return false;
  }
  if (!quantized_modules.empty() &&
      std::none_of(quantized_modules.begin(), quantized_modules.end(),
                   [&](const std::string& entry) {
                     return ModuleMatches(entry, module);
                   })) {
    return false;
  }
  return std::none_of(
      unquantized_modules.begin(), unquantized_modules.end(),
      [&](const std::string& entry) { return ModuleMatches(entry, module); });
}

bool MoeHParams::any_dense() const {
  for (uint8_t s : sparse_layers) {
    if (s == 0) return true;
  }
  return !enabled();
}

absl::Span<const ArchitectureConfig> ConfigArchitectures() {
  return kArchitectures;
}

absl::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kMistral:
      return "mistral";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kPhi3:
      return "phi3";
    case Architecture::kGemma:
      return "gemma";
    case Architecture::kGemma2:
      return "gemma2";
    case Architecture::kGemma3:
      return "gemma3_text";
    case Architecture::kMixtral:
      return "mixtral";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kQwen2Moe:
      return "qwen2_moe";
  }
  return "unknown";
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  ASSIGN_OR_RETURN(const Json root, ParseJson(json_text));
  try {
    return ParseRoot(root);
  } catch (const Json::exception& e) {
    // Every access above is type-checked first; this is a safety net.
    return absl::InvalidArgumentError(
        absl::StrCat("invalid config: ", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model directory ", model_dir, " does not exist"));
  }
  const std::string config_path =
      (fs::path(model_dir) / "config.json").string();
  if (!fs::exists(config_path, ec)) {
    return absl::NotFoundError(absl::StrCat(config_path, " not found"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
  if (!config.ok()) return Annotate(config.status(), config_path);

  // HF generate() stops on the generation config's eos ids as well.
  const std::string gen_path =
      (fs::path(model_dir) / "generation_config.json").string();
  if (fs::exists(gen_path, ec)) {
    ASSIGN_OR_RETURN(const std::string gen_text, ReadFile(gen_path));
    const absl::Status merged = MergeGenerationConfig(gen_text, &*config);
    if (!merged.ok()) return Annotate(merged, gen_path);
  }
  return config;
}

absl::Status MergeGenerationConfig(absl::string_view json_text,
                                   ModelConfig* config) {
  ASSIGN_OR_RETURN(const Json gen, ParseJson(json_text));
  if (!gen.is_object()) {
    return absl::InvalidArgumentError("must hold a JSON object");
  }
  return AppendTokenIds(Find(gen, "eos_token_id"), "eos_token_id",
                        config->vocab_size, &config->eos_token_ids);
}

absl::Status LimitContext(int64_t max_model_len, ModelConfig* config) {
  if (max_model_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len must be >= 0 (0: the model's), got ", max_model_len));
  }
  if (max_model_len > config->max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len ", max_model_len, " exceeds the model's context of ",
        config->max_position_embeddings,
        config->rope.scaling == RopeScaling::kDynamic ||
                config->rope.scaling == RopeScaling::kYarn
            ? " (max_position_embeddings in config.json, extended by its rope "
              "scaling)"
            : " (max_position_embeddings in config.json)"));
  }
  if (max_model_len > 0) config->max_position_embeddings = max_model_len;
  return absl::OkStatus();
}

}  // namespace tessera
