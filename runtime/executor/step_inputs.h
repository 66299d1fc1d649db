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
  absl::Status Fill(absl::Span<const SequenceSlice> seqs, int32_t block_size,
                    int64_t num_blocks, absl::Span<const int32_t> tokens,
                    absl::Span<const int32_t> logit_rows);

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
