#include "kernels/attention_metadata.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::Status PackAttentionMetadata(absl::Span<const SequenceSlice> seqs,
                                   int32_t block_size, int64_t num_blocks,
                                   const AttentionArrays& a,
                                   AttentionMetadata* out) {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention metadata: block size ", block_size));
  }
  const int64_t stride = a.block_table_stride;
  if (a.query_start_loc.empty() || stride < 0) {
    return absl::InvalidArgumentError(
        "attention metadata: no room for the query starts");
  }
  const size_t max_seqs = std::min(
      {a.query_start_loc.size() - 1, a.context_lens.size(), a.seq_lens.size(),
       stride > 0 ? a.block_tables.size() / stride : a.query_start_loc.size()});
  if (seqs.size() > max_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention metadata: ", seqs.size(),
                     " sequences in one step, at most ", max_seqs));
  }
  AttentionMetadata& m = *out;
  m.block_size = block_size;
  m.num_seqs = static_cast<int32_t>(seqs.size());
  m.num_decode_seqs = 0;
  m.max_query_len = 0;
  m.max_seq_len = 0;
  m.max_blocks_per_seq = static_cast<int32_t>(stride);
  m.num_blocks = 0;  // Until every value is checked.
  const size_t max_tokens = std::min(a.positions.size(), a.slot_mapping.size());
  bool decodes_leading = true;
  int64_t tokens = 0;
  a.query_start_loc[0] = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SequenceSlice& seq = seqs[s];
    const int64_t seq_len = seq.context_len + seq.query_len;
    if (seq.query_len <= 0 || seq.context_len < 0 ||
        seq_len > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention metadata: sequence #", s, " runs ",
                       seq.query_len, " tokens after ", seq.context_len));
    }
    const int64_t blocks_needed = (seq_len + block_size - 1) / block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention metadata: sequence #", s, " needs ",
                       blocks_needed, " blocks for ", seq_len,
                       " positions, its table has ", seq.block_table.size()));
    }
    if (blocks_needed > stride) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention metadata: sequence #", s, " needs ", blocks_needed,
          " blocks for ", seq_len, " positions, step tables hold ", stride));
    }
    for (int32_t b : seq.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("attention metadata: sequence #", s, " has block ", b,
                         " outside [0, ", num_blocks, ")"));
      }
    }
    if (static_cast<size_t>(tokens + seq.query_len) > max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention metadata: more than ", max_tokens,
                       " tokens in one step (sequence #", s, ")"));
    }
    if (seq.query_len == 1 && decodes_leading) {
      ++m.num_decode_seqs;
    } else {
      decodes_leading = false;
    }
    // The table's blocks beyond the stride are never read (checked above).
    int32_t* row = a.block_tables.data() + static_cast<int64_t>(s) * stride;
    const int64_t copied =
        std::min<int64_t>(stride, static_cast<int64_t>(seq.block_table.size()));
    std::copy_n(seq.block_table.begin(), copied, row);
    std::fill(row + copied, row + stride, -1);
    for (int64_t p = seq.context_len; p < seq_len; ++p, ++tokens) {
      a.positions[tokens] = static_cast<int32_t>(p);
      a.slot_mapping[tokens] =
          static_cast<int64_t>(row[p / block_size]) * block_size +
          p % block_size;
    }
    a.query_start_loc[s + 1] = static_cast<int32_t>(tokens);
    a.context_lens[s] = static_cast<int32_t>(seq.context_len);
    a.seq_lens[s] = static_cast<int32_t>(seq_len);
    m.max_query_len =
        std::max(m.max_query_len, static_cast<int32_t>(seq.query_len));
    m.max_seq_len = std::max(m.max_seq_len, static_cast<int32_t>(seq_len));
  }
  m.num_tokens = tokens;
  m.grid_max_seq_len = m.max_seq_len;
  m.num_blocks = num_blocks;
  return absl::OkStatus();
}

HostArrays ReadHostArrays(const AttentionMetadata& m) {
  auto i32 = [](const TensorView& t) {
    return absl::MakeConstSpan(t.data_as<const int32_t>(),
                               static_cast<size_t>(t.numel()));
  };
  HostArrays a;
  a.query_start_loc = i32(m.query_start_loc);
  a.context_lens = i32(m.context_lens);
  a.seq_lens = i32(m.seq_lens);
  a.positions = i32(m.positions);
  a.block_tables = i32(m.block_tables);
  a.slot_mapping =
      absl::MakeConstSpan(m.slot_mapping.data_as<const int64_t>(),
                          static_cast<size_t>(m.slot_mapping.numel()));
  a.stride = m.max_blocks_per_seq;
  return a;
}

AttentionMetadata HostAttentionMetadata::View() const {
  AttentionMetadata m;
  m.block_size = block_size;
  m.num_seqs = num_seqs;
  m.num_tokens = num_tokens;
  m.num_decode_seqs = num_decode_seqs;
  m.max_query_len = max_query_len;
  m.max_seq_len = max_seq_len;
  m.grid_max_seq_len = grid_max_seq_len;
  m.max_blocks_per_seq = max_blocks_per_seq;
  m.num_blocks = num_blocks;
  auto view = [](const auto& v, DType dtype, Shape shape) {
    // The ops take const data through TensorView's untyped pointer.
    return TensorView(const_cast<void*>(static_cast<const void*>(v.data())),
                      dtype, std::move(shape));
  };
  m.query_start_loc =
      view(query_start_loc, DType::kI32, {int64_t{num_seqs} + 1});
  m.context_lens = view(context_lens, DType::kI32, {num_seqs});
  m.seq_lens = view(seq_lens, DType::kI32, {num_seqs});
  m.positions = view(positions, DType::kI32, {num_tokens});
  m.slot_mapping = view(slot_mapping, DType::kI64, {num_tokens});
  m.block_tables =
      view(block_tables, DType::kI32, {num_seqs, max_blocks_per_seq});
  return m;
}

absl::StatusOr<HostAttentionMetadata> BuildAttentionMetadata(
    absl::Span<const SequenceSlice> seqs, int32_t block_size,
    int64_t num_blocks) {
  HostAttentionMetadata h;
  int64_t tokens = 0;
  size_t stride = 0;
  for (const SequenceSlice& s : seqs) {
    tokens += std::max<int64_t>(s.query_len, 0);
    stride = std::max(stride, s.block_table.size());
  }
  h.query_start_loc.resize(seqs.size() + 1);
  h.context_lens.resize(seqs.size());
  h.seq_lens.resize(seqs.size());
  h.positions.resize(tokens);
  h.slot_mapping.resize(tokens);
  h.block_tables.resize(seqs.size() * stride);
  AttentionArrays arrays;
  arrays.query_start_loc = absl::MakeSpan(h.query_start_loc);
  arrays.context_lens = absl::MakeSpan(h.context_lens);
  arrays.seq_lens = absl::MakeSpan(h.seq_lens);
  arrays.positions = absl::MakeSpan(h.positions);
  arrays.slot_mapping = absl::MakeSpan(h.slot_mapping);
  arrays.block_tables = absl::MakeSpan(h.block_tables);
  arrays.block_table_stride = static_cast<int32_t>(stride);
  AttentionMetadata m;
  RETURN_IF_ERROR(
      PackAttentionMetadata(seqs, block_size, num_blocks, arrays, &m));
  h.block_size = m.block_size;
  h.num_seqs = m.num_seqs;
  h.num_tokens = m.num_tokens;
  h.num_decode_seqs = m.num_decode_seqs;
  h.max_query_len = m.max_query_len;
  h.max_seq_len = m.max_seq_len;
  h.grid_max_seq_len = m.grid_max_seq_len;
  h.max_blocks_per_seq = m.max_blocks_per_seq;
  h.num_blocks = m.num_blocks;
  return h;
}

}  // namespace tessera
