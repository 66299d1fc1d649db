#include "kernels/attention_metadata.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<AttentionMetadata> BuildAttentionMetadata(
    absl::Span<const SequenceSlice> seqs, int32_t block_size,
    int64_t num_blocks) {
  AttentionMetadata m;
  RETURN_IF_ERROR(BuildAttentionMetadata(seqs, block_size, num_blocks, &m));
  return m;
}

absl::Status BuildAttentionMetadata(absl::Span<const SequenceSlice> seqs,
                                    int32_t block_size, int64_t num_blocks,
                                    AttentionMetadata* out) {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention metadata: block size ", block_size));
  }
  AttentionMetadata& m = *out;
  m.block_size = block_size;
  m.num_seqs = static_cast<int32_t>(seqs.size());
  m.num_decode_seqs = 0;
  m.max_query_len = 0;
  m.max_seq_len = 0;
  m.max_blocks_per_seq = 0;
  m.query_start_loc.clear();
  m.context_lens.clear();
  m.seq_lens.clear();
  m.positions.clear();
  m.slot_mapping.clear();
  m.query_start_loc.push_back(0);
  bool decodes_leading = true;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SequenceSlice& seq = seqs[s];
    const int64_t seq_len = seq.context_len + seq.query_len;
    const int64_t blocks_needed = (seq_len + block_size - 1) / block_size;
    if (seq.query_len <= 0 || seq.context_len < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention metadata: sequence #", s, " runs ",
                       seq.query_len, " tokens after ", seq.context_len));
    }
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention metadata: sequence #", s, " needs ",
                       blocks_needed, " blocks for ", seq_len,
                       " positions, its table has ", seq.block_table.size()));
    }
    for (int32_t b : seq.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("attention metadata: sequence #", s, " has block ", b,
                         " outside [0, ", num_blocks, ")"));
      }
    }
    if (seq.query_len == 1 && decodes_leading) {
      ++m.num_decode_seqs;
    } else {
      decodes_leading = false;
    }
    m.query_start_loc.push_back(
        static_cast<int32_t>(m.query_start_loc.back() + seq.query_len));
    m.context_lens.push_back(static_cast<int32_t>(seq.context_len));
    m.seq_lens.push_back(static_cast<int32_t>(seq_len));
    m.max_query_len =
        std::max(m.max_query_len, static_cast<int32_t>(seq.query_len));
    m.max_seq_len = std::max(m.max_seq_len, static_cast<int32_t>(seq_len));
    m.max_blocks_per_seq = std::max(
        m.max_blocks_per_seq, static_cast<int32_t>(seq.block_table.size()));
  }
  m.num_tokens = m.query_start_loc.back();
  m.block_tables.assign(static_cast<size_t>(m.num_seqs) * m.max_blocks_per_seq,
                        -1);
  m.positions.reserve(m.num_tokens);
  m.slot_mapping.reserve(m.num_tokens);
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    std::copy(seqs[s].block_table.begin(), seqs[s].block_table.end(),
              m.block_tables.begin() +
                  static_cast<int64_t>(s) * m.max_blocks_per_seq);
    for (int64_t p = m.context_lens[s]; p < m.seq_lens[s]; ++p) {
      m.positions.push_back(static_cast<int32_t>(p));
      m.slot_mapping.push_back(m.Slot(s, p));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
