#include "runtime/model/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// Elements one thread generates at a time.
constexpr int64_t kChunkElems = int64_t{1} << 20;

uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// FNV-1a of the tensor's name: each tensor its own stream.
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

enum class Init { kNormal, kOnes, kZeros };

// HF's _init_weights: Linear/Embedding normal(0, initializer_range), RMSNorm
// weights 1, biases 0.
Init InitOf(const WeightSpec& spec) {
  if (spec.full.rank() >= 2) return Init::kNormal;
  if (absl::StrContains(spec.name, "norm")) return Init::kOnes;
  return Init::kZeros;
}

// Approximately N(0, 1): four 16-bit uniforms of one hash, summed (mean 2,
// variance 1/3) and rescaled.
inline float NormalOf(uint64_t bits) {
  const float s = static_cast<float>(bits & 0xffff) +
                  static_cast<float>((bits >> 16) & 0xffff) +
                  static_cast<float>((bits >> 32) & 0xffff) +
                  static_cast<float>(bits >> 48) + 2.0f;    // 4 x (u + 0.5).
  constexpr float kScale = 1.7320508075688772f / 65536.0f;  // sqrt(3) / 2^16.
  return (s - 2.0f * 65536.0f) * kScale;
}

inline void Put(DType dtype, void* out, int64_t i, float v) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(out)[i] = F32ToBf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(out)[i] = F32ToF16(v);
      break;
    default:
      static_cast<float*>(out)[i] = v;
      break;
  }
}

// Elements of one row of dim 0 of the full tensor (1 for a vector).
int64_t FullRowElems(const Shape& full) {
  return full.rank() <= 1 ? 1 : full.numel() / full[0];
}

}  // namespace

absl::StatusOr<DType> RandomWeightDType(const ModelConfig& config) {
  const std::string& d = config.torch_dtype;
  if (d.empty() || d == "float32") return DType::kF32;
  if (d == "bfloat16") return DType::kBF16;
  if (d == "float16") return DType::kF16;
  return absl::InvalidArgumentError(absl::StrCat(
      "--random-weights: config torch_dtype \"", d,
      "\" is not a dtype random weights are made in (float32, bfloat16, "
      "float16)"));
}

absl::Status CheckRandomWeightConfig(const ModelConfig& config) {
  RETURN_IF_ERROR(RandomWeightDType(config).status());
  if (config.quant.quantized() && !config.quant.online) {
    return absl::UnimplementedError(
        absl::StrCat("--random-weights cannot make the fp8 tensors of a ",
                     config.quant.method,
                     " checkpoint's config; use an unquantized config with "
                     "--quantization fp8"));
  }
  // The head counts and head_dim first, so that their products cannot
  // overflow.
  const std::pair<const char*, int64_t> single[] = {
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_attention_heads", config.num_heads},
      {"num_key_value_heads", config.num_kv_heads},
      {"head_dim", config.head_dim},
  };
  for (const auto& [name, value] : single) {
    if (value > kMaxRandomDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("--random-weights: ", name, " is ", value,
                       ", more than the ", kMaxRandomDim, " supported"));
    }
  }
  if (config.num_heads * config.head_dim > kMaxRandomDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("--random-weights: num_attention_heads x head_dim is ",
                     config.num_heads * config.head_dim, ", more than the ",
                     kMaxRandomDim, " supported"));
  }
  // Stacked expert tensors are [E, 2I, H]: E x 2I within the same bound keeps
  // their element counts within int64 (config.h bounds E and I further).
  const MoeHParams& moe = config.moe;
  if (moe.num_experts * 2 *
          std::max(moe.expert_intermediate_size,
                   moe.shared_expert_intermediate_size) >
      kMaxRandomDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-weights: num_experts x 2 x moe_intermediate_size is ",
        moe.num_experts * 2 * moe.expert_intermediate_size, ", more than the ",
        kMaxRandomDim, " supported"));
  }
  return absl::OkStatus();
}

absl::Status CheckRandomWeights(const ModelConfig& config,
                                const WeightTable& table, DType matrix_dtype,
                                int64_t available_bytes, int64_t extra_bytes) {
  RETURN_IF_ERROR(CheckRandomWeightConfig(config));
  // Every dimension is below 2^24 and a table's tensors have rank <= 3 (the
  // layer count is bounded by the config), so each element count fits; the
  // sum is kept in double.
  double bytes = static_cast<double>(extra_bytes);
  for (const WeightSpec& spec : table) {
    bytes += static_cast<double>(spec.local_shape().numel()) *
             static_cast<double>(DTypeSize(StoredDType(spec, matrix_dtype)));
  }
  if (available_bytes >= 0 && bytes > static_cast<double>(available_bytes)) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--random-weights: this rank's weights need %.1f GiB (%d tensors as "
        "%s), but only %.1f GiB of memory is available",
        bytes / kGiB, table.size(), DTypeName(matrix_dtype),
        available_bytes / kGiB));
  }
  return absl::OkStatus();
}

void FillRandomSlice(const WeightSpec& spec, double stddev, uint64_t seed,
                     DType dtype, int64_t first, int64_t count, void* out) {
  const Init init = InitOf(spec);
  if (init != Init::kNormal) {
    const float v = init == Init::kOnes ? 1.0f : 0.0f;
    for (int64_t i = 0; i < count; ++i) Put(dtype, out, i, v);
    return;
  }
  const int64_t full_row = FullRowElems(spec.full);
  // Elements per local row, and where local row r starts in the full tensor
  // (-1: a vocabulary padding row, zeros).
  // An expert slice (inner ranges) is runs of the full tensor instead of
  // rows (weights.h ExpertSliceRunStart).
  const bool runs = spec.inner_dim > 0;
  const int64_t local_row = runs ? ExpertSliceRunElems(spec)
                            : spec.split == WeightSplit::kColumns
                                ? spec.end - spec.begin
                                : full_row;
  const auto row_start = [&](int64_t r) -> int64_t {
    if (runs) return ExpertSliceRunStart(spec, r);
    switch (spec.split) {
      case WeightSplit::kReplicated:
        return r * full_row;
      case WeightSplit::kRows:
      case WeightSplit::kExperts:
        return (spec.begin + r) * full_row;
      case WeightSplit::kVocab:
        return r < spec.end - spec.begin ? (spec.begin + r) * full_row : -1;
      case WeightSplit::kColumns:
        return r * spec.full[1] + spec.begin;
      case WeightSplit::kRowRanges: {
        // Local row r: the r-th row over the ranges in order.
        int64_t before = 0;
        for (const RowRange& range : spec.row_ranges) {
          const int64_t n = range.end - range.begin;
          if (r < before + n) return (range.begin + r - before) * full_row;
          before += n;
        }
        return -1;
      }
    }
    return -1;
  };
  const uint64_t key = SplitMix64(seed ^ NameHash(spec.name));
  const float scale = static_cast<float>(stddev);
  int64_t r = first / local_row;
  int64_t c = first % local_row;
  int64_t start = row_start(r);
  for (int64_t i = 0; i < count; ++i) {
    float v = 0.0f;
    if (start >= 0) {
      const uint64_t index = static_cast<uint64_t>(start + c);
      v = scale *
          NormalOf(SplitMix64(key + (index + 1) * 0x9E3779B97F4A7C15ULL));
    }
    Put(dtype, out, i, v);
    if (++c == local_row) {
      c = 0;
      start = row_start(++r);
    }
  }
}

absl::StatusOr<WeightSet> MakeRandomWeightSet(const ModelConfig& config,
                                              WeightTable table,
                                              const WeightLoadOptions& options,
                                              int64_t available_bytes,
                                              uint64_t seed, int threads) {
  if (options.device == nullptr && !options.upload) {
    return absl::InvalidArgumentError("MakeRandomWeightSet: no backend");
  }
  ASSIGN_OR_RETURN(const DType dtype, RandomWeightDType(config));
  int64_t largest = 0;
  for (const WeightSpec& spec : table) {
    largest = std::max(largest, SliceBytes(spec, dtype));
  }
  // The staging buffer (the largest slice, in `dtype`) is host memory: it
  // counts where the weights are host memory too (the CPU backend).
  const bool host = options.device == nullptr || options.device->host_memory();
  RETURN_IF_ERROR(CheckRandomWeights(config, table, options.matrix_dtype,
                                     available_bytes, host ? largest : 0));
  const UploadFn upload =
      options.upload ? options.upload : UploadTo(options.device);
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  WeightSet set(std::move(table));
  HostStaging staging;
  const size_t elem = DTypeSize(dtype);
  for (size_t i = 0; i < set.size(); ++i) {
    const WeightSpec& spec = set.table()[i];
    const Shape local = spec.local_shape();
    const int64_t n = local.numel();
    ASSIGN_OR_RETURN(
        void* buffer,
        staging.Reserve(static_cast<size_t>(SliceBytes(spec, dtype))));
    char* base = static_cast<char*>(buffer);
    const int64_t chunks = (n + kChunkElems - 1) / kChunkElems;
    const auto fill = [&](int64_t chunk) {
      const int64_t first = chunk * kChunkElems;
      FillRandomSlice(spec, config.initializer_range, seed, dtype, first,
                      std::min(kChunkElems, n - first),
                      base + static_cast<size_t>(first) * elem);
    };
    const int workers = static_cast<int>(std::min<int64_t>(threads, chunks));
    if (workers <= 1) {
      for (int64_t c = 0; c < chunks; ++c) fill(c);
    } else {
      std::atomic<int64_t> next{0};
      std::vector<std::thread> pool;
      pool.reserve(workers);
      for (int w = 0; w < workers; ++w) {
        pool.emplace_back([&] {
          for (int64_t c = next++; c < chunks; c = next++) fill(c);
        });
      }
      for (std::thread& t : pool) t.join();
    }
    RETURN_IF_ERROR(set.Store(i, TensorView(buffer, dtype, local), upload,
                              options.matrix_dtype));
    if (options.on_tensor) options.on_tensor();
    const bool part_done =
        i + 1 == set.size() || set.table()[i + 1].part != spec.part;
    if (part_done && options.on_part) options.on_part();
  }
  return set;
}

}  // namespace tessera
