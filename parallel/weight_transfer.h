// Weight transfer in WEIGHTS_FROM_RANK0 mode: rank 0 sends every rank its
// shard over the control channel as ShardChunk messages (proto/tessera.proto)
// of at most kShardChunkBytes each, in ForEachWeight order; the receiving
// rank checks every chunk against the shard it expects (index, name, shape,
// byte range) before copying it, so a mismatched grid or a corrupt message is
// a DataLoss error, never a silent write.
#ifndef TESSERA_PARALLEL_WEIGHT_TRANSFER_H_
#define TESSERA_PARALLEL_WEIGHT_TRANSFER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "parallel/control_channel.h"
#include "runtime/model/llama.h"

namespace tessera {

// The control-channel tag of ShardChunk messages.
inline constexpr int kShardTag = 10;
// ShardChunk payloads stay far below protobuf's 2 GiB limit.
inline constexpr int64_t kShardChunkBytes = int64_t{64} << 20;

// Rank 0: sends `weights` (rank `dest`'s shard), tensor by tensor.
absl::Status SendShard(ControlChannel& control, LlamaWeights& weights,
                       int dest);

// Other ranks: fills the allocated `weights` from rank 0's chunks.
absl::Status ReceiveShard(ControlChannel& control, LlamaWeights& weights);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_WEIGHT_TRANSFER_H_
