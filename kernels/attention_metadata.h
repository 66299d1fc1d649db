// AttentionMetadata: what every attention kernel of one step needs to know
// about the batch, built once per step (on each rank, from the step plan) and
// shared by every layer.
//
// A step runs the tokens of several sequences back to back: sequence s owns
// rows query_start_loc[s] .. query_start_loc[s + 1] - 1 of q/k/v. Its first
// query token sits at position context_lens[s] (the positions before it are
// already in the cache), so after the step its cache holds seq_lens[s] =
// context_lens[s] + query_len(s) positions.
//
// KV cache layout (paged): each layer's cache is a flat array of
// num_blocks * block_size slots; position p of sequence s lives in slot
// block_tables[s][p / block_size] * block_size + p % block_size. The static
// (contiguous) layout is the same with one block per sequence whose size is
// the sequence capacity, so position p is slot block_tables[s][0] *
// block_size + p.
//
// Order: the scheduler puts sequences with query_len == 1 (decodes) first,
// so that [0, num_decode_seqs) can run through the decode kernel and the rest
// through the varlen prefill kernel.
//
// Where the arrays live: the ops see AttentionMetadata, whose arrays are
// TensorViews in the backend's memory (device memory on a GPU, filled once per
// step by runtime/executor/step_inputs.h; host memory on the CPU). Its
// scalars are host values: they size grids and loops, and a device kernel
// never needs the arrays on the host. PackAttentionMetadata writes the arrays
// into fixed-capacity host memory and checks them; HostAttentionMetadata
// (BuildAttentionMetadata) is the same in host vectors, for tests and tools.
//
// Graph-safe steps (what a decode step must honour to be captured once in a
// CUDA graph and replayed at every later length; runtime/executor/
// graph_runner.h):
//  1. Launch configurations depend only on host values fixed for a batch
//     bucket — num_tokens, num_seqs, head counts, dims and grid_max_seq_len
//     (below) — never on the step's exact lengths, which kernels read from
//     the device arrays. No op of such a step reads or writes host memory,
//     allocates or synchronizes.
//  2. Padding: a step padded up to its bucket carries extra sequences with
//     query_len 1, context_len 0, seq_len 0, slot -1, an all -1 block table
//     row, token 0 and position 0. Attention writes zeros for a sequence of
//     seq_len 0 and reads none of its blocks; KV writes skip slot -1.
#ifndef TESSERA_KERNELS_ATTENTION_METADATA_H_
#define TESSERA_KERNELS_ATTENTION_METADATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/core/tensor.h"

namespace tessera {

struct AttentionMetadata {
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  // Leading sequences with query_len == 1.
  int32_t num_decode_seqs = 0;
  int32_t max_query_len = 0;  // Exact maxima over this batch.
  int32_t max_seq_len = 0;
  // An upper bound on every seq_len of the step that launch grids are sized
  // for (graph-safe launches: a kernel reads the actual lengths from the
  // device arrays and its blocks beyond a sequence's length exit). ==
  // max_seq_len for an eager step; == the rank's context for a step that a
  // CUDA graph replays (runtime/executor/graph_runner.h), so one captured
  // launch serves every length. 0 means "use max_seq_len".
  int32_t grid_max_seq_len = 0;
  // The row stride of block_tables (>= the blocks any sequence of the step
  // needs; a fixed capacity for step inputs, so kernels see one stride).
  int32_t max_blocks_per_seq = 0;
  // Every block id in the tables is in [0, num_blocks): checked once per step
  // when the arrays were packed (PackAttentionMetadata), with every other
  // value (offsets, lengths, positions, slots). 0: nobody checked them, and
  // the ops refuse the metadata. The per-op checks only compare it with the
  // cache (num_blocks * block_size slots must fit), so no op walks a table.
  int64_t num_blocks = 0;
  // The arrays, in the backend's memory.
  TensorView query_start_loc;  // kI32 [num_seqs + 1], starts at 0.
  TensorView context_lens;     // kI32 [num_seqs]
  TensorView seq_lens;         // kI32 [num_seqs]
  TensorView positions;        // kI32 [num_tokens]: the RoPE position.
  TensorView slot_mapping;     // kI64 [num_tokens]: where its K/V go.
  // kI32 [num_seqs, max_blocks_per_seq], row-major, padded with -1.
  TensorView block_tables;
};

// One sequence's part of a step, as the scheduler decided it.
struct SequenceSlice {
  int64_t context_len = 0;  // Positions already cached.
  int64_t query_len = 0;    // Tokens run this step (>= 1).
  // The sequence's block table; must cover context_len + query_len positions.
  absl::Span<const int32_t> block_table;
};

// Fixed-capacity host memory that PackAttentionMetadata writes one step's
// arrays into (the staging of step inputs, or HostAttentionMetadata's
// vectors).
struct AttentionArrays {
  absl::Span<int32_t> query_start_loc;  // >= max_seqs + 1 elements.
  absl::Span<int32_t> context_lens;     // >= max_seqs
  absl::Span<int32_t> seq_lens;         // >= max_seqs
  absl::Span<int32_t> positions;        // >= max_tokens
  absl::Span<int64_t> slot_mapping;     // >= max_tokens
  absl::Span<int32_t> block_tables;     // >= max_seqs * block_table_stride
  int32_t block_table_stride = 0;
};

// Packs the metadata of one step into `arrays` (sequence s's table at row s,
// padded with -1 to the stride) and sets the scalars of `*scalars`
// (grid_max_seq_len = max_seq_len: an eager step; its views
// are left alone: they belong to whoever owns the memory; num_blocks records
// the bound the block ids were checked against). InvalidArgument
// (naming the sequence) for a non-positive query length, a block table too
// short for its sequence or a block id outside [0, num_blocks), and for a
// step that does not fit the arrays (more sequences or tokens than they hold,
// a sequence needing more blocks than the stride). On error the arrays and
// scalars are unspecified.
absl::Status PackAttentionMetadata(absl::Span<const SequenceSlice> seqs,
                                   int32_t block_size, int64_t num_blocks,
                                   const AttentionArrays& arrays,
                                   AttentionMetadata* scalars);

// The metadata in host vectors, exactly sized (the block table stride is the
// longest table of the step). View() gives the ops' form over these vectors
// (for the CPU backend, and for tests that upload the arrays themselves); it
// is invalidated by any change to the vectors.
struct HostAttentionMetadata {
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  int32_t num_decode_seqs = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  int32_t grid_max_seq_len = 0;  // As AttentionMetadata's.
  int32_t max_blocks_per_seq = 0;
  int64_t num_blocks = 0;  // As AttentionMetadata's.
  std::vector<int32_t> query_start_loc;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;
  std::vector<int32_t> block_tables;

  int32_t query_len(int32_t seq) const {
    return query_start_loc[seq + 1] - query_start_loc[seq];
  }
  const int32_t* block_table(int32_t seq) const {
    return block_tables.data() + static_cast<int64_t>(seq) * max_blocks_per_seq;
  }
  // The slot of position `pos` of sequence `seq` (no bounds check).
  int64_t Slot(int32_t seq, int64_t pos) const {
    return static_cast<int64_t>(block_table(seq)[pos / block_size]) *
               block_size +
           pos % block_size;
  }
  AttentionMetadata View() const;
};

// The arrays of `m` read in place, for code that runs where they are host
// memory (the CPU backend, and the shared checks of op_checks.h on it). The
// views' dtypes and shapes must have been checked (CheckPagedAttention);
// meaningless for device memory.
struct HostArrays {
  absl::Span<const int32_t> query_start_loc, context_lens, seq_lens, positions,
      block_tables;
  absl::Span<const int64_t> slot_mapping;
  int32_t stride = 0;  // max_blocks_per_seq.
  const int32_t* block_table(int32_t seq) const {
    return block_tables.data() + static_cast<int64_t>(seq) * stride;
  }
};
HostArrays ReadHostArrays(const AttentionMetadata& m);

// Builds the metadata of one step in host vectors (PackAttentionMetadata's
// checks; the stride is the longest table, so nothing is too long).
absl::StatusOr<HostAttentionMetadata> BuildAttentionMetadata(
    absl::Span<const SequenceSlice> seqs, int32_t block_size,
    int64_t num_blocks);

}  // namespace tessera

#endif  // TESSERA_KERNELS_ATTENTION_METADATA_H_
