#include "runtime/executor/step_inputs.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMaxBufferBytes = size_t{1} << 30;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int32_t BlocksPerSequence(int64_t context, int64_t block_size) {
  if (context <= 0 || block_size <= 0) return 0;
  return static_cast<int32_t>(
      std::min<int64_t>((context + block_size - 1) / block_size, INT32_MAX));
}

absl::StatusOr<StepInputs::Layout> StepInputs::Plan(const StepInputsLimits& l) {
  if (l.max_tokens < 1 || l.max_seqs < 1 || l.max_logit_rows < 0 ||
      l.max_blocks_per_seq < 1 || l.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: limits of ", l.max_tokens, " tokens, ", l.max_seqs,
        " sequences, ", l.max_logit_rows, " logit rows, ", l.max_blocks_per_seq,
        " blocks per sequence, vocabulary ", l.vocab_size));
  }
  // Every term is checked against the cap before the next is added, so the
  // sum cannot overflow.
  const int64_t cap = static_cast<int64_t>(kMaxBufferBytes);
  if (l.max_tokens > cap / 16 || l.max_seqs > cap / 16 ||
      l.max_blocks_per_seq > cap / 4 ||
      static_cast<int64_t>(l.max_seqs) * l.max_blocks_per_seq > cap / 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: ", l.max_seqs, " sequences of up to ",
        l.max_blocks_per_seq, " blocks and ", l.max_tokens,
        " tokens per step need more than ", kMaxBufferBytes,
        " bytes of step buffers (lower --max-num-seqs or the context)"));
  }
  Layout o;
  size_t at = 0;
  auto take = [&](size_t* offset, size_t bytes) {
    *offset = at;
    at = AlignUp(at + bytes);
  };
  const size_t t = static_cast<size_t>(l.max_tokens);
  const size_t s = static_cast<size_t>(l.max_seqs);
  take(&o.tokens, t * sizeof(int32_t));
  take(&o.positions, t * sizeof(int32_t));
  take(&o.slots, t * sizeof(int64_t));
  take(&o.logit_rows, static_cast<size_t>(l.max_logit_rows) * sizeof(int32_t));
  take(&o.query_starts, (s + 1) * sizeof(int32_t));
  take(&o.context_lens, s * sizeof(int32_t));
  take(&o.seq_lens, s * sizeof(int32_t));
  take(&o.block_tables,
       s * static_cast<size_t>(l.max_blocks_per_seq) * sizeof(int32_t));
  o.end = at;
  if (o.end > kMaxBufferBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("step inputs: ", o.end, " bytes of step buffers, over ",
                     kMaxBufferBytes, " (lower --max-num-seqs)"));
  }
  return o;
}

absl::StatusOr<size_t> StepInputs::BufferBytes(const StepInputsLimits& l) {
  ASSIGN_OR_RETURN(const Layout layout, Plan(l));
  return layout.end;
}

StepInputs::StepInputs(const StepInputsLimits& limits, const Layout& layout,
                       std::unique_ptr<UploadBuffer> buffer)
    : limits_(limits), layout_(layout), buffer_(std::move(buffer)) {}

absl::StatusOr<std::unique_ptr<StepInputs>> StepInputs::Create(
    Ops* ops, const StepInputsLimits& limits) {
  ASSIGN_OR_RETURN(const Layout layout, Plan(limits));
  ASSIGN_OR_RETURN(std::unique_ptr<UploadBuffer> buffer,
                   ops->NewUploadBuffer(layout.end));
  return std::unique_ptr<StepInputs>(
      new StepInputs(limits, layout, std::move(buffer)));
}

TensorView StepInputs::DeviceArray(size_t offset, DType dtype,
                                   Shape shape) const {
  return TensorView(static_cast<char*>(buffer_->device()) + offset, dtype,
                    std::move(shape));
}

absl::Status StepInputs::Fill(absl::Span<const SequenceSlice> seqs,
                              int32_t block_size, int64_t num_blocks,
                              absl::Span<const int32_t> tokens,
                              absl::Span<const int32_t> logit_rows,
                              int32_t pad_to) {
  tokens_ = TensorView();
  logit_rows_ = TensorView();
  metadata_ = AttentionMetadata();
  last_upload_bytes_ = 0;
  const StepInputsLimits& l = limits_;
  const int64_t t = static_cast<int64_t>(tokens.size());
  if (t > l.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: ", t, " tokens in one step, at most ", l.max_tokens));
  }
  if (static_cast<int64_t>(seqs.size()) > l.max_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("step inputs: ", seqs.size(),
                     " sequences in one step, at most ", l.max_seqs));
  }
  const bool padded = pad_to > 0;
  const int64_t num_real = static_cast<int64_t>(seqs.size());
  const int64_t num_pad = padded ? pad_to - num_real : 0;
  if (padded) {
    if (num_pad < 0 || pad_to > l.max_seqs || t + num_pad > l.max_tokens ||
        static_cast<int64_t>(logit_rows.size()) + num_pad > l.max_logit_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step inputs: ", num_real, " sequences padded to ", pad_to,
          " (at most ", l.max_seqs, " sequences, ", l.max_tokens, " tokens, ",
          l.max_logit_rows, " logit rows)"));
    }
    for (const SequenceSlice& seq : seqs) {
      if (seq.query_len != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step inputs: only a decode step (one token per sequence) is "
            "padded, a sequence runs ",
            seq.query_len));
      }
    }
  }
  if (static_cast<int64_t>(logit_rows.size()) > l.max_logit_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step inputs: logits for ", logit_rows.size(),
                     " rows in one step, at most ", l.max_logit_rows));
  }
  for (int32_t id : tokens) {
    if (id < 0 || id >= l.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                       l.vocab_size, ")"));
    }
  }
  for (int32_t r : logit_rows) {
    if (r < 0 || r >= t) {
      return absl::InvalidArgumentError(
          absl::StrCat("step inputs: logit row ", r, " of ", t, " tokens"));
    }
  }
  ASSIGN_OR_RETURN(void* staging, buffer_->BeginWrite());
  char* base = static_cast<char*>(staging);
  auto i32 = [&](size_t offset, size_t n) {
    return absl::MakeSpan(reinterpret_cast<int32_t*>(base + offset), n);
  };
  const size_t s = static_cast<size_t>(l.max_seqs);
  AttentionArrays arrays;
  arrays.query_start_loc = i32(layout_.query_starts, s + 1);
  arrays.context_lens = i32(layout_.context_lens, s);
  arrays.seq_lens = i32(layout_.seq_lens, s);
  arrays.positions = i32(layout_.positions, l.max_tokens);
  arrays.slot_mapping = absl::MakeSpan(
      reinterpret_cast<int64_t*>(base + layout_.slots), l.max_tokens);
  arrays.block_tables =
      i32(layout_.block_tables, s * static_cast<size_t>(l.max_blocks_per_seq));
  arrays.block_table_stride = l.max_blocks_per_seq;
  AttentionMetadata m;
  RETURN_IF_ERROR(
      PackAttentionMetadata(seqs, block_size, num_blocks, arrays, &m));
  if (m.num_tokens != t) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: ", t, " tokens for sequences that run ", m.num_tokens));
  }
  if (t > 0) std::memcpy(base + layout_.tokens, tokens.data(), t * 4);
  if (!logit_rows.empty()) {
    std::memcpy(base + layout_.logit_rows, logit_rows.data(),
                logit_rows.size() * 4);
  }
  const int64_t rows = static_cast<int64_t>(logit_rows.size()) + num_pad;
  if (padded) {
    // Contract 2: the padding after the real sequences (all decodes).
    const size_t stride = static_cast<size_t>(l.max_blocks_per_seq);
    int32_t* starts = arrays.query_start_loc.data();
    int32_t* token_ids = reinterpret_cast<int32_t*>(base + layout_.tokens);
    int32_t* row_ids = reinterpret_cast<int32_t*>(base + layout_.logit_rows);
    for (int64_t i = 0; i < num_pad; ++i) {
      const size_t s_i = static_cast<size_t>(num_real + i);
      const int64_t tok = t + i;
      starts[s_i + 1] = static_cast<int32_t>(tok + 1);
      arrays.context_lens[s_i] = 0;
      arrays.seq_lens[s_i] = 0;
      arrays.positions[tok] = 0;
      arrays.slot_mapping[tok] = -1;
      std::fill_n(arrays.block_tables.data() + s_i * stride, stride, -1);
      token_ids[tok] = 0;
      row_ids[logit_rows.size() + i] = static_cast<int32_t>(tok);
    }
    m.num_seqs = pad_to;
    m.num_tokens = t + num_pad;
    m.num_decode_seqs = pad_to;
    m.max_query_len = 1;
    m.grid_max_seq_len = padded_grid_max_seq_len(block_size);
    // A real sequence longer than the grid's bound cannot be replayed.
    if (m.max_seq_len > m.grid_max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step inputs: a padded step's sequence reaches ", m.max_seq_len,
          " positions, beyond the grid's ", m.grid_max_seq_len));
    }
  }
  const int64_t seqs_total = m.num_seqs;
  const int64_t t_total = m.num_tokens;
  const size_t upload =
      layout_.block_tables + static_cast<size_t>(seqs_total) *
                                 static_cast<size_t>(l.max_blocks_per_seq) *
                                 sizeof(int32_t);
  RETURN_IF_ERROR(buffer_->Upload(upload));
  last_upload_bytes_ = upload;
  const int64_t n = m.num_seqs;
  m.query_start_loc = DeviceArray(layout_.query_starts, DType::kI32, {n + 1});
  m.context_lens = DeviceArray(layout_.context_lens, DType::kI32, {n});
  m.seq_lens = DeviceArray(layout_.seq_lens, DType::kI32, {n});
  m.positions = DeviceArray(layout_.positions, DType::kI32, {t_total});
  m.slot_mapping = DeviceArray(layout_.slots, DType::kI64, {t_total});
  m.block_tables = DeviceArray(layout_.block_tables, DType::kI32,
                               {n, int64_t{l.max_blocks_per_seq}});
  metadata_ = m;
  tokens_ = DeviceArray(layout_.tokens, DType::kI32, {t_total});
  logit_rows_ = DeviceArray(layout_.logit_rows, DType::kI32, {rows});
  return absl::OkStatus();
}

int32_t StepInputs::padded_grid_max_seq_len(int32_t block_size) const {
  const int64_t bound =
      limits_.max_seq_len > 0
          ? limits_.max_seq_len
          : int64_t{limits_.max_blocks_per_seq} * std::max(block_size, 1);
  return static_cast<int32_t>(std::min<int64_t>(bound, INT32_MAX));
}

}  // namespace tessera
