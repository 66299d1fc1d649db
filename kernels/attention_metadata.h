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
#ifndef TESSERA_KERNELS_ATTENTION_METADATA_H_
#define TESSERA_KERNELS_ATTENTION_METADATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {

struct AttentionMetadata {
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  // Leading sequences with query_len == 1.
  int32_t num_decode_seqs = 0;
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1], starts at 0.
  std::vector<int32_t> context_lens;     // [num_seqs]
  std::vector<int32_t> seq_lens;         // [num_seqs]
  int32_t max_query_len = 0;             // Exact maxima over this batch.
  int32_t max_seq_len = 0;
  std::vector<int32_t> positions;     // [num_tokens]: the RoPE position.
  std::vector<int64_t> slot_mapping;  // [num_tokens]: where its K/V go.
  // [num_seqs, max_blocks_per_seq], row-major, padded with -1.
  int32_t max_blocks_per_seq = 0;
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
};

// One sequence's part of a step, as the scheduler decided it.
struct SequenceSlice {
  int64_t context_len = 0;  // Positions already cached.
  int64_t query_len = 0;    // Tokens run this step (>= 1).
  // The sequence's block table; must cover context_len + query_len positions.
  absl::Span<const int32_t> block_table;
};

// Builds the metadata of one step: offsets, lengths, exact maxima, positions,
// slot mapping and the padded block tables. `num_blocks` bounds every block
// id. InvalidArgument (naming the sequence) for a non-positive query length,
// a block table too short for its sequence or a block id outside
// [0, num_blocks); num_decode_seqs counts the leading query_len == 1
// sequences.
absl::StatusOr<AttentionMetadata> BuildAttentionMetadata(
    absl::Span<const SequenceSlice> seqs, int32_t block_size,
    int64_t num_blocks);
// The same into `out`, reusing its vectors' memory (a step loop allocates
// nothing once they have grown). On error `out` is unspecified.
absl::Status BuildAttentionMetadata(absl::Span<const SequenceSlice> seqs,
                                    int32_t block_size, int64_t num_blocks,
                                    AttentionMetadata* out);

}  // namespace tessera

#endif  // TESSERA_KERNELS_ATTENTION_METADATA_H_
