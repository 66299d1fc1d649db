#include "runtime/engine/generation_defaults.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// generation_config.json is small; anything larger is not one.
constexpr uint64_t kMaxFileBytes = 1 << 20;

absl::Status Bad(absl::string_view key, absl::string_view expected,
                 const Json& value) {
  return absl::InvalidArgumentError(absl::StrCat("generation_config.json: \"",
                                                 key, "\" must be ", expected,
                                                 ", got ", value.dump()));
}

// A number field in range (null and absent leave it unset).
template <typename Check>
absl::Status ReadFloat(const Json& j, const char* key, Check check,
                       absl::string_view expected, std::optional<float>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(key, expected, *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || !check(v)) return Bad(key, expected, *it);
  *out = static_cast<float>(v);
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& j, const char* key, int64_t lo, int64_t hi,
                     absl::string_view expected, std::optional<int64_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return Bad(key, expected, *it);
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(key, expected, *it);
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return Bad(key, expected, *it);
  *out = v;
  return absl::OkStatus();
}

// Not a plain open(): a FIFO named generation_config.json must be refused,
// not waited on.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  return ReadRegularFile(path, kMaxFileBytes);
}

}  // namespace

std::string GenerationDefaults::Describe() const {
  std::vector<std::string> parts;
  if (temperature) parts.push_back(absl::StrCat("temperature=", *temperature));
  if (top_p) parts.push_back(absl::StrCat("top_p=", *top_p));
  if (top_k) parts.push_back(absl::StrCat("top_k=", *top_k));
  if (min_p) parts.push_back(absl::StrCat("min_p=", *min_p));
  if (repetition_penalty) {
    parts.push_back(absl::StrCat("repetition_penalty=", *repetition_penalty));
  }
  if (max_tokens) parts.push_back(absl::StrCat("max_tokens=", *max_tokens));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

absl::StatusOr<GenerationDefaults> ParseGenerationDefaults(
    absl::string_view json_text) {
  // nlohmann's parser keeps its own stack (no recursion), and nothing below
  // copies or walks nested values.
  const Json j = Json::parse(json_text.begin(), json_text.end(), nullptr,
                             /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("generation_config.json: malformed JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        "generation_config.json is not a JSON object");
  }
  GenerationDefaults d;
  RETURN_IF_ERROR(ReadFloat(
      j, "temperature", [](double v) { return v >= 0; }, "a number >= 0",
      &d.temperature));
  RETURN_IF_ERROR(ReadFloat(
      j, "top_p", [](double v) { return v > 0 && v <= 1; },
      "a number in (0, 1]", &d.top_p));
  RETURN_IF_ERROR(ReadFloat(
      j, "min_p", [](double v) { return v >= 0 && v <= 1; },
      "a number in [0, 1]", &d.min_p));
  RETURN_IF_ERROR(ReadFloat(
      j, "repetition_penalty", [](double v) { return v > 0; }, "a number > 0",
      &d.repetition_penalty));
  std::optional<int64_t> top_k;
  RETURN_IF_ERROR(ReadInt(j, "top_k", -1, std::numeric_limits<int64_t>::max(),
                          "an integer >= -1", &top_k));
  if (top_k) {
    d.top_k = *top_k <= 0 ? 0
                          : static_cast<int32_t>(std::min<int64_t>(
                                *top_k, std::numeric_limits<int32_t>::max()));
  }
  RETURN_IF_ERROR(ReadInt(j, "max_new_tokens", 1,
                          std::numeric_limits<int64_t>::max(),
                          "an integer >= 1", &d.max_tokens));
  return d;
}

absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(
    const std::string& model_dir, absl::string_view mode) {
  if (mode == "vllm" || mode == "none") return GenerationDefaults{};
  namespace fs = std::filesystem;
  std::error_code ec;
  if (mode == "auto") {
    const std::string path =
        (fs::path(model_dir) / "generation_config.json").string();
    if (!fs::exists(path, ec)) return GenerationDefaults{};
    ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path));
    absl::StatusOr<GenerationDefaults> d = ParseGenerationDefaults(text);
    if (!d.ok()) return Annotate(d.status(), path);
    return d;
  }
  const std::string dir(mode);
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--generation-config must be auto, vllm, none or a folder holding "
        "generation_config.json, got \"",
        dir, "\""));
  }
  const std::string path = (fs::path(dir) / "generation_config.json").string();
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, " not found"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path));
  absl::StatusOr<GenerationDefaults> d = ParseGenerationDefaults(text);
  if (!d.ok()) return Annotate(d.status(), path);
  return d;
}

}  // namespace tessera
