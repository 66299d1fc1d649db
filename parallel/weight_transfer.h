// Weight transfer in WEIGHTS_FROM_RANK0 mode: rank 0 sends every rank its
// shard over the control channel as ShardChunk messages (proto/tessera.proto)
// of at most kShardChunkBytes each, in the order of the rank's WeightTable
// (runtime/model/weights.h), in the checkpoint's dtype.
//
// Streaming, tensor by tensor: rank 0 reads each tensor's slice straight from
// the mmapped checkpoint (or one reused staging buffer for strided slices) and
// sends it; it never holds another rank's shard. The receiver checks every
// chunk against the table it expects (index, name, shape, dtype, byte range)
// and stores each tensor in its backend (Ops::Upload) as soon as its last
// chunk is in, so it holds at most one tensor on the host. A mismatched grid
// or a corrupt message is a DataLoss error, never a silent write.
#ifndef TESSERA_PARALLEL_WEIGHT_TRANSFER_H_
#define TESSERA_PARALLEL_WEIGHT_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "parallel/control_channel.h"
#include "proto/tessera.pb.h"
#include "runtime/core/tensor.h"
#include "runtime/model/llama.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"

namespace tessera {

// The control-channel tag of ShardChunk messages.
inline constexpr int kShardTag = 10;
// ShardChunk payloads stay far below protobuf's 2 GiB limit.
inline constexpr int64_t kShardChunkBytes = int64_t{64} << 20;

// Where chunks go and come from: the control channel in a job, a queue in
// tests.
using ChunkSink = std::function<absl::Status(const proto::ShardChunk&)>;
using ChunkSource = std::function<absl::Status(proto::ShardChunk*)>;

// Sends tensor `index` of a table (`name`, this rank's slice `host` in any
// dtype) as chunks of at most `chunk_bytes`; `last` marks the shard's final
// tensor.
absl::Status SendWeight(const ChunkSink& sink, int32_t index,
                        const std::string& name, const TensorView& host,
                        bool last, int64_t chunk_bytes = kShardChunkBytes);

// Rank 0: reads every tensor of `table` (rank `dest`'s, from
// ModelWeightTable) from `checkpoint` and sends it, one tensor at a time.
// `on_part` is called after each part of the table (WeightSpec::part) is sent.
// Errors reading the checkpoint are those of the loader (a missing tensor is
// NotFound naming it, a shape mismatch InvalidArgument).
absl::Status SendShard(const ChunkSink& sink, const Checkpoint& checkpoint,
                       const WeightTable& table,
                       const std::function<void()>& on_part = {},
                       int64_t chunk_bytes = kShardChunkBytes);
absl::Status SendShard(ControlChannel& control, const Checkpoint& checkpoint,
                       const WeightTable& table, int dest,
                       const std::function<void()>& on_part = {});

// Other ranks: receives the tensors of `table` (this rank's) and stores each
// through `ops` (matrices as `matrix_dtype`) as soon as it is complete.
// DataLoss when a chunk does not fit the table or the shard ends early.
absl::StatusOr<WeightSet> ReceiveShard(const ChunkSource& source,
                                       WeightTable table, Ops* ops,
                                       DType matrix_dtype);
absl::StatusOr<WeightSet> ReceiveShard(ControlChannel& control,
                                       WeightTable table, Ops* ops,
                                       DType matrix_dtype);

// The f32 host path of LlamaWeights (until its callers move to the above):
// rank 0 sends `weights` (rank `dest`'s shard), tensor by tensor; other ranks
// fill the allocated `weights` from rank 0's chunks.
absl::Status SendShard(ControlChannel& control, LlamaWeights& weights,
                       int dest);
absl::Status ReceiveShard(ControlChannel& control, LlamaWeights& weights);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_WEIGHT_TRANSFER_H_
