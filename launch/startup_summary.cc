#include "launch/startup_summary.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

// Bytes as GiB (or MiB below one GiB), two decimals.
std::string Size(int64_t bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  constexpr double kMiB = 1024.0 * 1024.0;
  if (bytes >= int64_t{1} << 30) {
    return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / kGiB);
  }
  return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / kMiB);
}

}  // namespace

std::vector<std::string> StartupSummaryLines(const StartupFacts& f) {
  std::vector<std::string> lines;
  const std::string where =
      f.ranks > 1 ? absl::StrCat(" on rank 0 of ", f.ranks) : std::string();
  lines.push_back(absl::StrFormat(
      "[tessera] model: %s weights%s, %s (%d bytes)%s on %s; context %d tokens",
      f.weight_dtype,
      f.quantization.empty() ? ""
                             : absl::StrCat(", linear layers ", f.quantization),
      Size(f.weight_bytes), f.weight_bytes, where, f.device, f.max_model_len));
  const int64_t tokens = f.num_kv_blocks * f.block_size;
  const double concurrency =
      f.max_model_len > 0
          ? static_cast<double>(tokens) / static_cast<double>(f.max_model_len)
          : 0.0;
  lines.push_back(absl::StrFormat(
      "[tessera] KV cache: %d %s x %d tokens = %d tokens (%s, %s%s); Maximum "
      "concurrency for %d tokens per request: %.2fx",
      f.num_kv_blocks, f.static_layout ? "sequence slots" : "blocks",
      f.block_size, tokens,
      f.kv_dtype == "fp8"
          ? (f.kv_checkpoint_scales ? "fp8 e4m3, the checkpoint's scales"
                                    : "fp8 e4m3, scales 1")
          : f.kv_dtype,
      Size(f.kv_bytes), where, f.max_model_len, concurrency));
  if (f.graph_buckets.empty()) {
    lines.push_back(
        absl::StrCat("[tessera] decode CUDA graphs: none",
                     f.no_graphs_reason.empty()
                         ? ""
                         : absl::StrCat(" (", f.no_graphs_reason, ")")));
  } else {
    lines.push_back(absl::StrCat(
        "[tessera] decode CUDA graphs: ", f.graph_buckets.size(),
        f.graph_buckets.size() == 1 ? " batch size: " : " batch sizes: ",
        absl::StrJoin(f.graph_buckets, " ")));
  }
  return lines;
}

}  // namespace tessera
