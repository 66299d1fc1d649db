// StepInputs: the per-step arrays of one rank (token ids, logit rows, and the
// attention metadata's positions, slot mapping, query starts, context and
// sequence lengths, block tables) in fixed-capacity buffers of the backend's
// memory, sized once when the rank is built and filled once per step.
//
// Fill packs the step into one host staging block (page-locked on a GPU),
// checks every value against the model, the KV pool and the step (token ids
// in the vocabulary, block ids in the pool, logit rows in the step), and
// makes it the buffers' contents with ONE host-to-device copy on the
// backend's stream (kernels/upload_buffer.h; on the CPU backend the staging is
// the buffer and nothing is copied). The views it hands out (tokens(),
// logit_rows(), metadata()) point into those buffers at addresses that never
// change, so the ops of a step look nothing up by host pointer and a captured
// CUDA graph can read them; only their shapes (and the metadata's scalars)
// follow the step.
//
// Layout: one block, each array at a fixed offset sized for its capacity; the
// block tables come last with a fixed row stride (limits.max_blocks_per_seq,
// padded with -1), so a step copies the arrays' full capacity up to the end
// of its own table rows.
//
// The views stay valid until the next Fill. Not thread-safe.
#ifndef TESSERA_RUNTIME_EXECUTOR_STEP_INPUTS_H_
#define TESSERA_RUNTIME_EXECUTOR_STEP_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_metadata.h"
#include "kernels/ops.h"
#include "runtime/core/tensor.h"

namespace tessera {

struct StepInputsLimits {
  int64_t max_tokens = 0;          // Tokens per step (>= 1).
  int32_t max_seqs = 0;            // Sequences per step (>= 1).
  int32_t max_logit_rows = 0;      // Rows whose logits a step wants (>= 0).
  int32_t max_blocks_per_seq = 0;  // Block table stride (>= 1).
  int64_t vocab_size = 0;          // Token ids must be in [0, vocab_size).
  // The rank's context: the grid_max_seq_len of a padded (graph) step. 0:
  // max_blocks_per_seq * the step's block size.
  int64_t max_seq_len = 0;
};

// The block table stride for `context` positions in blocks of `block_size`.
int32_t BlocksPerSequence(int64_t context, int64_t block_size);

class StepInputs {
 public:
  // Bytes of the buffer for `limits`; InvalidArgument for a non-positive
  // limit or a buffer over 1 GiB (a sequence count no step can use).
  static absl::StatusOr<size_t> BufferBytes(const StepInputsLimits& limits);
  // Allocates the buffer through `ops` (which must outlive the inputs).
  static absl::StatusOr<std::unique_ptr<StepInputs>> Create(
      Ops* ops, const StepInputsLimits& limits);

  // One step: sequences `seqs` (their blocks of `block_size` slots, ids in
  // [0, num_blocks)) running `tokens` (their concatenation, in order), and the
  // rows of `tokens` whose logits are wanted. InvalidArgument (nothing is
  // copied) when a value is out of range or the step exceeds the limits; the
  // views are empty then (the buffer may hold part of the rejected step).
  //
  // pad_to > 0 pads a decode step up to a CUDA graph's batch bucket
  // (runtime/executor/graph_runner.h; graph-safe steps 2 of
  // attention_metadata.h): every real sequence must run one token
  // (InvalidArgument otherwise), and sequences seqs.size() .. pad_to - 1 are
  // padding — query_len 1, context_len 0, seq_len 0, slot -1 (the cache write
  // skips it), a block table row of -1, token id 0, position 0 — whose one row
  // each is appended to logit_rows (so the step's logits have pad_to rows, the
  // real ones first). The scalars count the padding (num_seqs = num_tokens =
  // num_decode_seqs = pad_to), max_seq_len stays the real sequences' maximum,
  // and grid_max_seq_len is limits.max_seq_len (the rank's context), the same
  // for every padded step, so a captured launch fits every one (pad_to ==
  // seqs.size() adds no sequence but is such a step). pad_to == 0 is an
  // eager step: grid_max_seq_len = max_seq_len.
  absl::Status Fill(absl::Span<const SequenceSlice> seqs, int32_t block_size,
                    int64_t num_blocks, absl::Span<const int32_t> tokens,
                    absl::Span<const int32_t> logit_rows, int32_t pad_to = 0);
  // The grid_max_seq_len of a padded step with blocks of `block_size`.
  int32_t padded_grid_max_seq_len(int32_t block_size) const;

  // The last Fill's arrays in the backend's memory.
  const TensorView& tokens() const { return tokens_; }          // kI32 [T]
  const TensorView& logit_rows() const { return logit_rows_; }  // kI32 [n]
  const AttentionMetadata& metadata() const { return metadata_; }

  const StepInputsLimits& limits() const { return limits_; }
  size_t buffer_bytes() const { return buffer_->bytes(); }
  // Bytes the last Fill copied (its one upload).
  size_t last_upload_bytes() const { return last_upload_bytes_; }

 private:
  struct Layout {
    size_t tokens, positions, slots, logit_rows, query_starts, context_lens,
        seq_lens, block_tables, end;
  };
  static absl::StatusOr<Layout> Plan(const StepInputsLimits& limits);
  StepInputs(const StepInputsLimits& limits, const Layout& layout,
             std::unique_ptr<UploadBuffer> buffer);
  TensorView DeviceArray(size_t offset, DType dtype, Shape shape) const;

  StepInputsLimits limits_;
  Layout layout_;
  std::unique_ptr<UploadBuffer> buffer_;
  TensorView tokens_, logit_rows_;
  AttentionMetadata metadata_;
  size_t last_upload_bytes_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_STEP_INPUTS_H_
