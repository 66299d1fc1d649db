#include "kernels/attention_metadata.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(AttentionMetadataTest, BuildsOffsetsPositionsSlotsAndTables) {
  // Two leading decodes, a chunked prefill, then a decode that does not count
  // as leading.
  const std::vector<int32_t> t0 = {7, 2};
  const std::vector<int32_t> t1 = {4};
  const std::vector<int32_t> t2 = {0, 9, 3};  // One block more than needed.
  const std::vector<int32_t> t3 = {5, 1, 6};
  const std::vector<SequenceSlice> seqs = {
      {5, 1, t0}, {0, 1, t1}, {3, 4, t2}, {10, 1, t3}};
  auto m = BuildAttentionMetadata(seqs, /*block_size=*/4, /*num_blocks=*/10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->block_size, 4);
  EXPECT_EQ(m->num_seqs, 4);
  EXPECT_EQ(m->num_tokens, 7);
  EXPECT_EQ(m->num_decode_seqs, 2);
  EXPECT_EQ(m->query_start_loc, (std::vector<int32_t>{0, 1, 2, 6, 7}));
  EXPECT_EQ(m->context_lens, (std::vector<int32_t>{5, 0, 3, 10}));
  EXPECT_EQ(m->seq_lens, (std::vector<int32_t>{6, 1, 7, 11}));
  EXPECT_EQ(m->max_query_len, 4);
  EXPECT_EQ(m->max_seq_len, 11);
  EXPECT_EQ(m->positions, (std::vector<int32_t>{5, 0, 3, 4, 5, 6, 10}));
  // Position p of a sequence: table[p / 4] * 4 + p % 4.
  EXPECT_EQ(m->slot_mapping,
            (std::vector<int64_t>{2 * 4 + 1, 4 * 4 + 0, 0 * 4 + 3, 9 * 4 + 0,
                                  9 * 4 + 1, 9 * 4 + 2, 6 * 4 + 2}));
  EXPECT_EQ(m->max_blocks_per_seq, 3);
  EXPECT_EQ(m->block_tables, (std::vector<int32_t>{7, 2, -1,   //
                                                   4, -1, -1,  //
                                                   0, 9, 3,    //
                                                   5, 1, 6}));
  for (int32_t s = 0; s < m->num_seqs; ++s) {
    EXPECT_EQ(m->query_len(s), seqs[s].query_len);
  }
  EXPECT_EQ(m->block_table(2)[1], 9);
  EXPECT_EQ(m->Slot(3, 8), 6 * 4 + 0);
  EXPECT_EQ(m->Slot(0, 3), 7 * 4 + 3);
}

TEST(AttentionMetadataTest, AllDecodesAndStaticLayout) {
  // Static layout: one block per sequence of size = capacity.
  const std::vector<int32_t> t0 = {2};
  const std::vector<int32_t> t1 = {0};
  const std::vector<SequenceSlice> seqs = {{31, 1, t0}, {0, 1, t1}};
  auto m = BuildAttentionMetadata(seqs, /*block_size=*/32, /*num_blocks=*/3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_decode_seqs, 2);
  EXPECT_EQ(m->max_query_len, 1);
  EXPECT_EQ(m->max_seq_len, 32);
  EXPECT_EQ(m->slot_mapping, (std::vector<int64_t>{2 * 32 + 31, 0}));
  EXPECT_EQ(m->Slot(0, 7), 2 * 32 + 7);
}

TEST(AttentionMetadataTest, EmptyStep) {
  auto m = BuildAttentionMetadata({}, /*block_size=*/16, /*num_blocks=*/4);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_seqs, 0);
  EXPECT_EQ(m->num_tokens, 0);
  EXPECT_EQ(m->num_decode_seqs, 0);
  EXPECT_EQ(m->query_start_loc, (std::vector<int32_t>{0}));
  EXPECT_TRUE(m->positions.empty());
  EXPECT_TRUE(m->slot_mapping.empty());
  EXPECT_TRUE(m->block_tables.empty());
}

TEST(AttentionMetadataTest, RejectsBadSequences) {
  const std::vector<int32_t> ok_table = {1, 2};
  const std::vector<int32_t> short_table = {1};
  const std::vector<int32_t> negative_block = {1, -1};
  const std::vector<int32_t> big_block = {1, 4};
  auto expect_invalid = [](std::vector<SequenceSlice> seqs, int32_t block_size,
                           absl::string_view needle) {
    auto m = BuildAttentionMetadata(seqs, block_size, /*num_blocks=*/4);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(needle), absl::string_view::npos)
        << m.status();
  };
  expect_invalid({{0, 1, ok_table}}, 0, "block size");
  expect_invalid({{0, 1, ok_table}, {2, 0, ok_table}}, 4, "sequence #1");
  expect_invalid({{-1, 2, ok_table}}, 4, "sequence #0");
  // 5 positions need 2 blocks of 4.
  expect_invalid({{0, 1, ok_table}, {4, 1, short_table}}, 4, "sequence #1");
  expect_invalid({{0, 5, negative_block}}, 4, "sequence #0");
  // Block ids are checked even where the table is longer than needed.
  expect_invalid({{0, 1, big_block}}, 4, "block 4");
  EXPECT_TRUE(BuildAttentionMetadata({{4, 4, ok_table}}, 4, 4).ok());
}

// Packing into fixed capacity: tables at the capacity stride padded with -1,
// every array untouched beyond the step, and limits that the step must fit.
TEST(AttentionMetadataTest, PacksIntoFixedCapacity) {
  std::vector<int32_t> qsl(4, 77), ctx(3, 77), lens(3, 77), pos(6, 77);
  std::vector<int64_t> slots(6, 77);
  std::vector<int32_t> tables(3 * 4, 77);
  AttentionArrays a;
  a.query_start_loc = absl::MakeSpan(qsl);
  a.context_lens = absl::MakeSpan(ctx);
  a.seq_lens = absl::MakeSpan(lens);
  a.positions = absl::MakeSpan(pos);
  a.slot_mapping = absl::MakeSpan(slots);
  a.block_tables = absl::MakeSpan(tables);
  a.block_table_stride = 4;
  const std::vector<int32_t> t0 = {5};
  const std::vector<int32_t> t1 = {1, 2, 3, 0, 4};  // Longer than the stride.
  AttentionMetadata m;
  ASSERT_TRUE(
      PackAttentionMetadata({{2, 1, t0}, {0, 3, t1}}, 4, 6, a, &m).ok());
  EXPECT_EQ(m.num_seqs, 2);
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.num_decode_seqs, 1);
  EXPECT_EQ(m.max_blocks_per_seq, 4);
  EXPECT_EQ(m.num_blocks, 6);  // Checked: the ops take it.
  EXPECT_EQ(qsl, (std::vector<int32_t>{0, 1, 4, 77}));
  EXPECT_EQ(ctx, (std::vector<int32_t>{2, 0, 77}));
  EXPECT_EQ(lens, (std::vector<int32_t>{3, 3, 77}));
  EXPECT_EQ(pos, (std::vector<int32_t>{2, 0, 1, 2, 77, 77}));
  EXPECT_EQ(slots, (std::vector<int64_t>{22, 4, 5, 6, 77, 77}));
  EXPECT_EQ(tables, (std::vector<int32_t>{5, -1, -1, -1, 1, 2, 3, 0,  //
                                          77, 77, 77, 77}));
  // Packing leaves the views alone.
  EXPECT_EQ(m.positions.data(), nullptr);

  auto invalid = [&](std::vector<SequenceSlice> seqs,
                     absl::string_view needle) {
    const absl::Status st = PackAttentionMetadata(seqs, 4, 6, a, &m);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), absl::string_view::npos) << st;
  };
  invalid({{0, 1, t0}, {0, 1, t0}, {0, 1, t0}, {0, 1, t0}},
          "4 sequences in one step, at most 3");
  invalid({{0, 7, t1}}, "more than 6 tokens");
  const std::vector<int32_t> t2 = {1, 2, 3, 0, 4};
  invalid({{16, 1, t2}}, "step tables hold 4");
  EXPECT_EQ(m.num_blocks, 0);  // A refused step is marked unchecked.
}

TEST(AttentionMetadataTest, HostViewPointsAtTheVectors) {
  const std::vector<int32_t> t0 = {1, 2};
  auto h = BuildAttentionMetadata({{3, 2, t0}}, 4, 3);
  ASSERT_TRUE(h.ok()) << h.status();
  const AttentionMetadata v = h->View();
  EXPECT_EQ(v.num_tokens, 2);
  EXPECT_EQ(v.max_blocks_per_seq, 2);
  EXPECT_EQ(v.positions.data(), h->positions.data());
  EXPECT_EQ(v.positions.dtype(), DType::kI32);
  EXPECT_EQ(v.positions.shape(), Shape({2}));
  EXPECT_EQ(v.slot_mapping.data(), h->slot_mapping.data());
  EXPECT_EQ(v.slot_mapping.dtype(), DType::kI64);
  EXPECT_EQ(v.query_start_loc.shape(), Shape({2}));
  EXPECT_EQ(v.block_tables.shape(), Shape({1, 2}));
  EXPECT_EQ(v.block_tables.data(), h->block_tables.data());
}

}  // namespace
}  // namespace tessera
