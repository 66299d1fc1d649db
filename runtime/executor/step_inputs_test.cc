#include "runtime/executor/step_inputs.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

template <typename T>
std::vector<T> Read(const TensorView& v) {
  const T* p = v.data_as<const T>();
  return std::vector<T>(p, p + v.numel());
}

StepInputsLimits Limits() {
  StepInputsLimits l;
  l.max_tokens = 8;
  l.max_seqs = 3;
  l.max_logit_rows = 3;
  l.max_blocks_per_seq = 4;
  l.vocab_size = 100;
  return l;
}

TEST(StepInputsTest, BlocksPerSequence) {
  EXPECT_EQ(BlocksPerSequence(64, 16), 4);
  EXPECT_EQ(BlocksPerSequence(65, 16), 5);
  EXPECT_EQ(BlocksPerSequence(64, 64), 1);
  EXPECT_EQ(BlocksPerSequence(0, 16), 0);
}

// The views point at the same fixed addresses every step (what a captured
// graph needs), hold the packed step with tables at the capacity stride, and
// one upload covers the arrays up to the end of the step's own table rows.
TEST(StepInputsTest, FillPacksTheStepAtFixedAddresses) {
  CpuOps ops;
  auto inputs = StepInputs::Create(&ops, Limits());
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  StepInputs& in = **inputs;
  const std::vector<int32_t> t0 = {3, 1, 4};
  const std::vector<int32_t> t1 = {0, 2, 5};
  const std::vector<SequenceSlice> seqs = {{4, 1, t0}, {0, 3, t1}};
  const std::vector<int32_t> tokens = {7, 8, 9, 10};
  const std::vector<int32_t> rows = {0, 3};
  ASSERT_TRUE(
      in.Fill(seqs, /*block_size=*/2, /*num_blocks=*/6, tokens, rows).ok());
  const AttentionMetadata& m = in.metadata();
  EXPECT_EQ(m.num_seqs, 2);
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.num_decode_seqs, 1);
  EXPECT_EQ(m.max_query_len, 3);
  EXPECT_EQ(m.max_seq_len, 5);
  EXPECT_EQ(m.max_blocks_per_seq, 4);  // The capacity, not this step's 3.
  EXPECT_EQ(Read<int32_t>(in.tokens()), tokens);
  EXPECT_EQ(Read<int32_t>(in.logit_rows()), rows);
  EXPECT_EQ(Read<int32_t>(m.query_start_loc), (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(Read<int32_t>(m.context_lens), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(Read<int32_t>(m.seq_lens), (std::vector<int32_t>{5, 3}));
  EXPECT_EQ(Read<int32_t>(m.positions), (std::vector<int32_t>{4, 0, 1, 2}));
  EXPECT_EQ(Read<int64_t>(m.slot_mapping),
            (std::vector<int64_t>{4 * 2 + 0, 0, 1, 2 * 2 + 0}));
  EXPECT_EQ(Read<int32_t>(m.block_tables),
            (std::vector<int32_t>{3, 1, 4, -1, 0, 2, 5, -1}));
  EXPECT_EQ(m.slot_mapping.dtype(), DType::kI64);
  EXPECT_EQ(m.block_tables.shape(), Shape({2, 4}));
  const size_t first_upload = in.last_upload_bytes();
  EXPECT_GT(first_upload, 0u);
  EXPECT_LE(first_upload, in.buffer_bytes());

  const void* tokens_at = in.tokens().data();
  const void* tables_at = m.block_tables.data();
  const void* slots_at = m.slot_mapping.data();
  const std::vector<int32_t> t2 = {4};
  const std::vector<SequenceSlice> one = {{1, 1, t2}};
  const std::vector<int32_t> token = {99};
  const std::vector<int32_t> row = {0};
  ASSERT_TRUE(in.Fill(one, 2, 6, token, row).ok());
  EXPECT_EQ(in.tokens().data(), tokens_at);
  EXPECT_EQ(in.metadata().block_tables.data(), tables_at);
  EXPECT_EQ(in.metadata().slot_mapping.data(), slots_at);
  EXPECT_EQ(Read<int64_t>(in.metadata().slot_mapping),
            (std::vector<int64_t>{4 * 2 + 1}));
  EXPECT_EQ(Read<int32_t>(in.metadata().block_tables),
            (std::vector<int32_t>{4, -1, -1, -1}));
  // One table row fewer to copy.
  EXPECT_EQ(in.last_upload_bytes(), first_upload - 4 * sizeof(int32_t));
}

TEST(StepInputsTest, RejectsValuesAndStepsBeyondTheLimits) {
  CpuOps ops;
  auto inputs = StepInputs::Create(&ops, Limits());
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  StepInputs& in = **inputs;
  const std::vector<int32_t> table = {1, 2};
  const std::vector<int32_t> long_table = {1, 2, 3, 4, 5};
  auto expect = [&](std::vector<SequenceSlice> seqs, int64_t num_blocks,
                    std::vector<int32_t> tokens, std::vector<int32_t> rows,
                    absl::string_view needle) {
    const absl::Status st = in.Fill(seqs, 2, num_blocks, tokens, rows);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), absl::string_view::npos) << st;
    EXPECT_EQ(in.tokens().data(), nullptr);
    EXPECT_EQ(in.metadata().num_seqs, 0);
  };
  expect({{0, 2, table}}, 6, {5, 100}, {1}, "token id 100");
  expect({{0, 2, table}}, 6, {5, -1}, {1}, "token id -1");
  expect({{0, 2, table}}, 6, {5, 6}, {2}, "logit row 2");
  expect({{0, 2, table}}, 6, {5, 6, 7}, {},
         "3 tokens for sequences that run 2");
  expect({{0, 2, table}}, 2, {5, 6}, {}, "block 2 outside [0, 2)");
  expect({{0, 9, table}}, 6, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {}, "9 tokens");
  expect({{0, 1, table}, {0, 1, table}, {0, 1, table}, {0, 1, table}}, 6,
         {1, 2, 3, 4}, {}, "4 sequences");
  expect({{0, 1, table}, {0, 1, table}}, 6, {1, 2}, {0, 1, 1, 1},
         "logits for 4 rows");
  // Nine positions need five blocks of two; tables hold four.
  expect({{8, 1, long_table}}, 6, {1}, {}, "step tables hold 4");
  // A table longer than needed is fine when the needed blocks fit.
  EXPECT_TRUE(in.Fill({{0, 1, long_table}}, 2, 6, {1}, {0}).ok());
  EXPECT_EQ(Read<int32_t>(in.metadata().block_tables),
            (std::vector<int32_t>{1, 2, 3, 4}));
}

// Contract 2: a decode step padded to its graph bucket. The real sequences
// come first, unchanged; each padding sequence runs one token (id 0,
// position 0, slot -1) with context 0, seq_len 0 and a table row of -1, and
// its row is appended to the logit rows. The scalars count the padding, the
// real maximum stays, and the grid bound is the rank's context.
TEST(StepInputsTest, PadsADecodeStepToItsBucket) {
  CpuOps ops;
  StepInputsLimits l = Limits();
  l.max_seqs = 4;
  l.max_logit_rows = 4;
  l.max_seq_len = 7;
  auto inputs = StepInputs::Create(&ops, l);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  StepInputs& in = **inputs;
  const std::vector<int32_t> t0 = {3, 1};
  const std::vector<int32_t> t1 = {5};
  const std::vector<SequenceSlice> seqs = {{2, 1, t0}, {0, 1, t1}};
  ASSERT_TRUE(in.Fill(seqs, /*block_size=*/2, /*num_blocks=*/6, {7, 8}, {0, 1},
                      /*pad_to=*/4)
                  .ok());
  const AttentionMetadata& m = in.metadata();
  EXPECT_EQ(m.num_seqs, 4);
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.num_decode_seqs, 4);
  EXPECT_EQ(m.max_query_len, 1);
  EXPECT_EQ(m.max_seq_len, 3);       // The real sequences' maximum.
  EXPECT_EQ(m.grid_max_seq_len, 7);  // limits.max_seq_len.
  EXPECT_EQ(m.num_blocks, 6);
  EXPECT_EQ(Read<int32_t>(in.tokens()), (std::vector<int32_t>{7, 8, 0, 0}));
  EXPECT_EQ(Read<int32_t>(in.logit_rows()), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Read<int32_t>(m.query_start_loc),
            (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Read<int32_t>(m.context_lens), (std::vector<int32_t>{2, 0, 0, 0}));
  EXPECT_EQ(Read<int32_t>(m.seq_lens), (std::vector<int32_t>{3, 1, 0, 0}));
  EXPECT_EQ(Read<int32_t>(m.positions), (std::vector<int32_t>{2, 0, 0, 0}));
  EXPECT_EQ(Read<int64_t>(m.slot_mapping),
            (std::vector<int64_t>{1 * 2 + 0, 5 * 2 + 0, -1, -1}));
  EXPECT_EQ(Read<int32_t>(m.block_tables),
            (std::vector<int32_t>{3, 1, -1, -1, 5, -1, -1, -1,  //
                                  -1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(m.block_tables.shape(), Shape({4, 4}));
  // The upload covers the padding's table rows too.
  EXPECT_EQ(in.last_upload_bytes() % sizeof(int32_t), 0u);
  const size_t padded_upload = in.last_upload_bytes();

  // The same step unpadded is an eager step: its grid is its maximum.
  ASSERT_TRUE(in.Fill(seqs, 2, 6, {7, 8}, {0, 1}).ok());
  EXPECT_EQ(in.metadata().num_seqs, 2);
  EXPECT_EQ(in.metadata().grid_max_seq_len, 3);
  EXPECT_EQ(in.last_upload_bytes(), padded_upload - 8 * sizeof(int32_t));

  // A step of padding only (what a graph is captured with), and the grid
  // bound of limits without a context: the tables' capacity.
  l.max_seq_len = 0;
  auto bare = StepInputs::Create(&ops, l);
  ASSERT_TRUE(bare.ok()) << bare.status();
  ASSERT_TRUE((*bare)->Fill({}, 2, 6, {}, {}, /*pad_to=*/3).ok());
  const AttentionMetadata& p = (*bare)->metadata();
  EXPECT_EQ(p.num_seqs, 3);
  EXPECT_EQ(p.num_tokens, 3);
  EXPECT_EQ(p.max_seq_len, 0);
  EXPECT_EQ(p.grid_max_seq_len, 4 * 2);
  EXPECT_EQ(Read<int32_t>(p.seq_lens), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(Read<int32_t>((*bare)->logit_rows()),
            (std::vector<int32_t>{0, 1, 2}));
}

TEST(StepInputsTest, PaddingIsChecked) {
  CpuOps ops;
  StepInputsLimits l = Limits();  // 3 sequences, 8 tokens, 3 logit rows.
  l.max_seq_len = 5;
  auto inputs = StepInputs::Create(&ops, l);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  StepInputs& in = **inputs;
  const std::vector<int32_t> table = {1, 2, 3};
  auto expect = [&](std::vector<SequenceSlice> seqs,
                    std::vector<int32_t> tokens, std::vector<int32_t> rows,
                    int32_t pad_to, absl::string_view needle) {
    const absl::Status st = in.Fill(seqs, 2, 6, tokens, rows, pad_to);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), absl::string_view::npos) << st;
    EXPECT_EQ(in.tokens().data(), nullptr);
  };
  // Fewer than the real sequences, more than the limits.
  expect({{0, 1, table}, {0, 1, table}}, {1, 2}, {0, 1}, 1, "padded to 1");
  expect({{0, 1, table}}, {1}, {0}, 4, "padded to 4");
  // The padding's logit rows must fit too.
  expect({{0, 1, table}, {0, 1, table}}, {1, 2}, {0, 1, 1}, 3, "padded to 3");
  // Only decodes are padded.
  expect({{0, 2, table}}, {1, 2}, {1}, 2, "only a decode step");
  // A sequence beyond the grid's bound cannot be replayed.
  expect({{5, 1, table}}, {1}, {0}, 2, "beyond the grid's 5");
}

TEST(StepInputsTest, LimitsAreChecked) {
  StepInputsLimits l = Limits();
  EXPECT_TRUE(StepInputs::BufferBytes(l).ok());
  l.max_seqs = 0;
  EXPECT_EQ(StepInputs::BufferBytes(l).status().code(),
            absl::StatusCode::kInvalidArgument);
  l = Limits();
  l.max_seqs = 1 << 20;
  l.max_blocks_per_seq = 1 << 12;  // 16 GiB of tables.
  const auto huge = StepInputs::BufferBytes(l);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("--max-num-seqs"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace tessera
