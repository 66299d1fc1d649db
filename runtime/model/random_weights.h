// Random weights from a config alone (`--random-weights`): every tensor of a
// rank's weight table made up from config.json, with no safetensors, so that
// a large shape (an 8B model) can be benchmarked without writing 16 GB.
//
// The values:
//  - deterministic: element i of tensor `name` (i its index in the FULL
//    tensor, row-major) is a function of (seed, name, i) alone — a
//    counter-based hash, no generator state — so a tensor-parallel rank's
//    slice holds exactly the elements the whole tensor holds at TP 1, and two
//    runs (or two thread counts) give the same bits;
//  - scaled like Hugging Face's _init_weights: matrices (projections,
//    embedding, head, experts) approximately normal with mean 0 and standard
//    deviation config.initializer_range (an Irwin-Hall sum of 4 uniforms,
//    rescaled: cheap, bounded at +-3.46 sd); norms (vectors whose name says
//    "norm") 1; biases 0; the vocabulary padding rows of a vocab split 0;
//  - in the config's torch_dtype (float32, bfloat16 or float16; a config
//    without one is float32, as transformers reads it), then stored through
//    the backend's Upload like a checkpoint of that dtype would be;
//  - fast: generated on every core in chunks of a fixed size, into one reused
//    host staging buffer (the largest slice), one tensor at a time.
//
// Refused before any memory is taken (InvalidArgument / ResourceExhausted):
// an unknown torch_dtype, a dimension beyond kMaxRandomDim, and a rank whose
// weights do not fit the memory the caller says it has (host memory on the
// CPU backend, the device's free memory on a GPU).
#ifndef TESSERA_RUNTIME_MODEL_RANDOM_WEIGHTS_H_
#define TESSERA_RUNTIME_MODEL_RANDOM_WEIGHTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/dtype.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// The largest config dimension (vocab_size, hidden_size, intermediate_size,
// heads x head_dim) random weights are made for: far beyond any real model,
// small enough that no tensor's element count overflows.
inline constexpr int64_t kMaxRandomDim = int64_t{1} << 24;

// The seed of `--random-weights` (every run, every rank).
inline constexpr uint64_t kRandomWeightSeed = 0x7e55e4a;

// The dtype random weights are generated in: config.torch_dtype (float32,
// bfloat16, float16; "" = float32). InvalidArgument naming it otherwise.
absl::StatusOr<DType> RandomWeightDType(const ModelConfig& config);

// The config's part of the checks, before a weight table is made from it:
// the dtype and every dimension (InvalidArgument naming it).
absl::Status CheckRandomWeightConfig(const ModelConfig& config);

// The checks made before any tensor exists: the config's, the dimensions, and
// the bytes `table` takes stored with matrices as `matrix_dtype` (norms and
// biases f32), plus `extra_bytes` (host staging where the weights are host
// memory), against `available_bytes` (< 0: not checked).
// ResourceExhausted says how much is needed and available.
absl::Status CheckRandomWeights(const ModelConfig& config,
                                const WeightTable& table, DType matrix_dtype,
                                int64_t available_bytes,
                                int64_t extra_bytes = 0);

// Writes elements [first, first + count) of `spec`'s local slice, generated as
// the header says, to `out` (count elements of `dtype`). The unit the loader
// runs on each thread; exposed for tests.
void FillRandomSlice(const WeightSpec& spec, double stddev, uint64_t seed,
                     DType dtype, int64_t first, int64_t count, void* out);

// Every tensor of `table` (from ModelWeightTable(config, shard)), generated
// and stored through options.device / options.upload as StoredDType(spec,
// options.matrix_dtype); options.on_part after each part. `available_bytes`
// as CheckRandomWeights (checked first). `threads` <= 0: every core.
absl::StatusOr<WeightSet> MakeRandomWeightSet(const ModelConfig& config,
                                              WeightTable table,
                                              const WeightLoadOptions& options,
                                              int64_t available_bytes,
                                              uint64_t seed = kRandomWeightSeed,
                                              int threads = 0);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_RANDOM_WEIGHTS_H_
