#include "parallel/weight_transfer.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/model/config.h"
#include "runtime/model/registry.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"
#include "runtime/model/testing/checkpoint_writer.h"

namespace tessera {
namespace {

constexpr char kConfig[] = R"({
  "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 101, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": true})";

class WeightTransferTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(testing::TempDir()) / "weight_transfer")
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/config.json") << kConfig;
    auto config = ParseModelConfig(kConfig);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto full = ModelWeightTable(config_, FullModel(config_));
    ASSERT_TRUE(full.ok());
    testing_util::CheckpointWriter writer;
    for (const WeightSpec& spec : *full) {
      writer.AddRandom(spec.name, DType::kBF16, spec.full);
    }
    writer.Write(dir_ + "/model.safetensors");
    auto ckpt = Checkpoint::Open(dir_);
    ASSERT_TRUE(ckpt.ok());
    ckpt_ = *std::move(ckpt);
  }

  // Rank (tp_rank, pp_stage)'s table of a TP2 × PP2 grid.
  WeightTable Table(int tp_rank, int pp_stage) {
    auto shard = MakeShardSpec(config_, tp_rank, 2, pp_stage, 2);
    EXPECT_TRUE(shard.ok()) << shard.status();
    shard_ = *shard;
    return *ModelWeightTable(config_, shard_);
  }

  // Sends `table` into a queue in chunks of `chunk_bytes`.
  std::deque<proto::ShardChunk> Send(const WeightTable& table,
                                     int64_t chunk_bytes) {
    std::deque<proto::ShardChunk> queue;
    int parts = 0;
    const absl::Status sent = SendShard(
        [&](const proto::ShardChunk& c) {
          EXPECT_LE(static_cast<int64_t>(c.data().size()), chunk_bytes);
          queue.push_back(c);
          return absl::OkStatus();
        },
        *ckpt_, table, [&] { ++parts; }, chunk_bytes);
    EXPECT_TRUE(sent.ok()) << sent;
    EXPECT_EQ(parts, WeightParts(table));
    return queue;
  }

  absl::StatusOr<WeightSet> Receive(std::deque<proto::ShardChunk> queue,
                                    WeightTable table) {
    return ReceiveShard(
        [&queue](proto::ShardChunk* c) {
          if (queue.empty()) return absl::DataLossError("queue drained");
          *c = queue.front();
          queue.pop_front();
          return absl::OkStatus();
        },
        std::move(table), &ops_, DType::kF32);
  }

  std::string dir_;
  ModelConfig config_;
  ShardSpec shard_;
  std::unique_ptr<Checkpoint> ckpt_;
  CpuOps ops_;
};

TEST_F(WeightTransferTest, ReceivedShardEqualsReadingItLocally) {
  for (int stage = 0; stage < 2; ++stage) {
    for (int tp = 0; tp < 2; ++tp) {
      const WeightTable table = Table(tp, stage);
      // Small chunks: most tensors arrive in several pieces.
      std::deque<proto::ShardChunk> queue = Send(table, 1000);
      for (const proto::ShardChunk& c : queue) {
        EXPECT_EQ(c.dtype(), "BF16") << "weights travel in the file's dtype";
      }
      auto received = Receive(queue, table);
      ASSERT_TRUE(received.ok()) << received.status();
      WeightLoadOptions options;
      options.ops = &ops_;
      auto local = LoadShardWeights(*ckpt_, config_, shard_, options);
      ASSERT_TRUE(local.ok()) << local.status();
      for (const WeightSpec& spec : table) {
        const Tensor* a = received->Find(spec.name);
        const Tensor* b = local->Find(spec.name);
        ASSERT_TRUE(a != nullptr && b != nullptr) << spec.name;
        ASSERT_EQ(a->shape(), b->shape());
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0)
            << spec.name << " of rank (" << tp << ", " << stage << ")";
      }
    }
  }
}

TEST_F(WeightTransferTest, OneChunkTensorsAndBigChunks) {
  const WeightTable table = Table(1, 1);
  auto received = Receive(Send(table, kShardChunkBytes), table);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_TRUE(received->complete());
}

TEST_F(WeightTransferTest, MismatchedChunksAreDataLoss) {
  const WeightTable table = Table(0, 0);
  const std::deque<proto::ShardChunk> good = Send(table, 1000);
  {  // Another stage's table.
    auto r = Receive(good, Table(0, 1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  }
  {  // A chunk dropped.
    std::deque<proto::ShardChunk> q = good;
    q.erase(q.begin() + 1);
    EXPECT_EQ(Receive(q, table).status().code(), absl::StatusCode::kDataLoss);
  }
  {  // The shard ends early.
    std::deque<proto::ShardChunk> q = good;
    q.resize(3);
    q.back().set_last(true);
    auto r = Receive(q, table);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("ended after"), std::string::npos)
        << r.status();
  }
  {  // Too many bytes.
    std::deque<proto::ShardChunk> q = good;
    q.front().mutable_data()->append("xx");
    EXPECT_EQ(Receive(q, table).status().code(), absl::StatusCode::kDataLoss);
  }
  {  // An unknown dtype.
    std::deque<proto::ShardChunk> q = good;
    q.front().set_dtype("Q4");
    EXPECT_EQ(Receive(q, table).status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST_F(WeightTransferTest, SendNamesAMissingTensor) {
  WeightTable table = Table(0, 0);
  table.push_back(Replicated("model.missing.weight", {4}, 99));
  const absl::Status sent = SendShard(
      [](const proto::ShardChunk&) { return absl::OkStatus(); }, *ckpt_, table);
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(sent.message().find("model.missing.weight"), std::string::npos);
}

}  // namespace
}  // namespace tessera
