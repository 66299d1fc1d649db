#include "runtime/kv/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int kBlockSize = 4;

BlockManager Make(int num_blocks, bool prefix_caching = true,
                  BlockManager::HashFn hash_fn = nullptr) {
  BlockManager::Options options;
  options.num_blocks = num_blocks;
  options.block_size = kBlockSize;
  options.enable_prefix_caching = prefix_caching;
  options.hash_fn = std::move(hash_fn);
  auto bm = BlockManager::Create(std::move(options));
  EXPECT_TRUE(bm.ok()) << bm.status();
  return std::move(bm).value();
}

// Tokens start, start+1, ..., start+n-1.
std::vector<TokenId> Range(int start, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a,
                            const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Allocates and returns the cached-token count; fails the test on an error or
// on "cannot allocate".
int Alloc(BlockManager& bm, SeqId id, const std::vector<TokenId>& tokens) {
  auto r = bm.AllocateSequence(id, tokens);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return -1;
  EXPECT_TRUE(r->has_value()) << "sequence " << id << " did not fit";
  return r->value_or(-1);
}

std::vector<BlockId> Table(const BlockManager& bm, SeqId id) {
  auto t = bm.BlockTable(id);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  return std::vector<BlockId>(t->begin(), t->end());
}

TEST(BlockManagerTest, RejectsBadOptions) {
  BlockManager::Options options;
  options.num_blocks = 0;
  EXPECT_EQ(BlockManager::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.num_blocks = 4;
  options.block_size = 0;
  EXPECT_EQ(BlockManager::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockManagerTest, AllocateAndFreeCounts) {
  BlockManager bm = Make(10);
  EXPECT_EQ(bm.stats().num_free_blocks, 10);
  EXPECT_EQ(Alloc(bm, 1, Range(0, 9)), 0);  // 3 blocks.
  EXPECT_EQ(bm.stats().num_free_blocks, 7);
  EXPECT_EQ(bm.stats().num_used_blocks, 3);
  EXPECT_EQ(Alloc(bm, 2, Range(100, 4)), 0);  // 1 block.
  EXPECT_EQ(bm.stats().num_used_blocks, 4);
  ASSERT_TRUE(bm.Free(1).ok());
  EXPECT_EQ(bm.stats().num_free_blocks, 9);
  EXPECT_EQ(bm.stats().num_used_blocks, 1);
  ASSERT_TRUE(bm.Free(2).ok());
  EXPECT_EQ(bm.stats().num_free_blocks, 10);
  EXPECT_EQ(bm.stats().num_used_blocks, 0);
  EXPECT_FALSE(bm.HasSequence(1));
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, BlockTableAndSlotMappingFollowAppends) {
  BlockManager bm = Make(8);
  Alloc(bm, 7, Range(0, 6));  // Blocks 0, 1 (fresh queue is in id order).
  EXPECT_EQ(Table(bm, 7), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(*bm.SlotMapping(7, 0), 0);
  EXPECT_EQ(*bm.SlotMapping(7, 5), 1 * kBlockSize + 1);
  EXPECT_EQ(bm.SlotMapping(7, 6).status().code(),
            absl::StatusCode::kOutOfRange);
  // Two more tokens fill block 1; the third takes a new block.
  ASSERT_TRUE(*bm.AppendSlots(7, {6, 7}));
  EXPECT_EQ(Table(bm, 7).size(), 2u);
  ASSERT_TRUE(*bm.AppendSlots(7, {8}));
  EXPECT_EQ(Table(bm, 7), (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(*bm.NumTokens(7), 9);
  EXPECT_EQ(*bm.SlotMapping(7, 8), 2 * kBlockSize + 0);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, ErrorsNameTheSequence) {
  BlockManager bm = Make(8);
  Alloc(bm, 42, Range(0, 3));
  auto dup = bm.AllocateSequence(42, Range(0, 3));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("42"), absl::string_view::npos);
  EXPECT_EQ(bm.AllocateSequence(43, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto unknown = bm.AppendSlots(99, {1});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("99"), absl::string_view::npos);
  EXPECT_EQ(bm.Free(99).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bm.BlockTable(99).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bm.SlotMapping(99, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bm.CanAppendSlots(99, 1).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(bm.Free(42).ok());
  EXPECT_EQ(bm.Free(42).code(), absl::StatusCode::kNotFound);  // Double free.
}

TEST(BlockManagerTest, OutOfBlocksIsAValueAndChangesNothing) {
  BlockManager bm = Make(4);
  Alloc(bm, 1, Range(0, 10));  // 3 blocks.
  const auto before = bm.stats();
  EXPECT_FALSE(bm.CanAllocate(8));
  auto r = bm.AllocateSequence(2, Range(100, 8));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(bm.HasSequence(2));
  // Append: 10 + 7 tokens need 5 blocks, only 4 exist.
  EXPECT_FALSE(*bm.CanAppendSlots(1, 7));
  auto a = bm.AppendSlots(1, Range(10, 7));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(*a);
  EXPECT_EQ(*bm.NumTokens(1), 10);
  EXPECT_EQ(Table(bm, 1).size(), 3u);
  const auto after = bm.stats();
  EXPECT_EQ(after.num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(after.queried_tokens, before.queried_tokens);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, SharedPrefixIsReusedButNeverTheWholePrompt) {
  BlockManager bm = Make(16);
  const auto prefix = Range(0, 3 * kBlockSize);
  EXPECT_EQ(Alloc(bm, 1, Concat(prefix, Range(500, 2))), 0);
  EXPECT_EQ(bm.stats().num_cached_blocks, 3);
  EXPECT_EQ(Alloc(bm, 2, Concat(prefix, Range(900, 3))), 3 * kBlockSize);
  const auto t1 = Table(bm, 1);
  const auto t2 = Table(bm, 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t1[i], t2[i]);
    EXPECT_EQ(bm.RefCount(t1[i]), 2);
  }
  EXPECT_NE(t1[3], t2[3]);
  EXPECT_EQ(bm.stats().hit_tokens, 3 * kBlockSize);
  EXPECT_EQ(bm.stats().queried_tokens, 2 * 3 * kBlockSize + 5);
  // The exact prefix as a prompt: all of it is cached, yet the last block is
  // recomputed so that the last token has logits.
  EXPECT_EQ(bm.NumCachedTokens(prefix), 2 * kBlockSize);
  EXPECT_EQ(Alloc(bm, 3, prefix), 2 * kBlockSize);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, DecodeFilledBlocksBecomeShareable) {
  BlockManager bm = Make(8);
  Alloc(bm, 1, Range(0, 3));
  ASSERT_TRUE(*bm.AppendSlots(1, {3}));  // Block 0 is now full.
  ASSERT_TRUE(*bm.AppendSlots(1, {4}));
  EXPECT_EQ(bm.stats().num_cached_blocks, 1);
  EXPECT_EQ(Alloc(bm, 2, Range(0, 6)), kBlockSize);
}

TEST(BlockManagerTest, EvictsLeastRecentlyReleasedFirst) {
  BlockManager bm = Make(4);
  const auto a = Range(0, 2 * kBlockSize);
  const auto b = Range(100, 2 * kBlockSize);
  Alloc(bm, 1, a);
  Alloc(bm, 2, b);
  const auto table_a = Table(bm, 1);
  const auto table_b = Table(bm, 2);
  ASSERT_TRUE(bm.Free(1).ok());  // A released first: evicted first.
  ASSERT_TRUE(bm.Free(2).ok());
  EXPECT_EQ(bm.stats().num_cached_blocks, 4);
  Alloc(bm, 3, Range(1000, 2 * kBlockSize));
  auto t3 = Table(bm, 3);
  std::sort(t3.begin(), t3.end());
  auto sorted_a = table_a;
  std::sort(sorted_a.begin(), sorted_a.end());
  EXPECT_EQ(t3, sorted_a);
  // Within A, the tail went back first, so it is reused first.
  EXPECT_EQ(Table(bm, 3)[0], table_a[1]);
  // B's blocks were not touched: B's first block still hits (and is taken out
  // of the free queue rather than reallocated).
  EXPECT_EQ(Alloc(bm, 4, Concat(Range(100, kBlockSize), {7, 7})), kBlockSize);
  EXPECT_EQ(Table(bm, 4)[0], table_b[0]);
  EXPECT_EQ(bm.RefCount(table_b[0]), 1);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, AHitRefreshesABlocksPlaceInTheEvictionOrder) {
  BlockManager bm = Make(4);
  const auto a = Concat(Range(0, kBlockSize), {50});  // Full + partial.
  const auto b = Concat(Range(100, kBlockSize), {60});
  Alloc(bm, 1, a);               // Blocks 0 (cached), 1.
  Alloc(bm, 2, b);               // Blocks 2 (cached), 3.
  ASSERT_TRUE(bm.Free(1).ok());  // Queue: 1 0.
  ASSERT_TRUE(bm.Free(2).ok());  // Queue: 1 0 3 2.
  // A hit on A's root takes it out of the queue (touch) and the new tail
  // comes from the front: queue 3 2. Releasing puts both behind B's blocks.
  EXPECT_EQ(Alloc(bm, 3, Concat(Range(0, kBlockSize), {70})), kBlockSize);
  EXPECT_EQ(Table(bm, 3), (std::vector<BlockId>{0, 1}));
  ASSERT_TRUE(bm.Free(3).ok());  // Queue: 3 2 1 0.
  // So two fresh blocks evict B's, although A was released first.
  Alloc(bm, 4, Range(1000, 2 * kBlockSize));
  EXPECT_EQ(Table(bm, 4), (std::vector<BlockId>{3, 2}));
  EXPECT_EQ(bm.NumCachedTokens(b), 0);
  EXPECT_EQ(bm.NumCachedTokens(a), kBlockSize);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, ReallocationDropsTheOldHash) {
  BlockManager bm = Make(2);
  const auto a = Range(0, kBlockSize + 1);
  Alloc(bm, 1, a);
  ASSERT_TRUE(bm.Free(1).ok());
  EXPECT_EQ(bm.NumCachedTokens(a), kBlockSize);  // Lazily kept.
  Alloc(bm, 2, Range(50, 2 * kBlockSize));       // Takes both blocks.
  EXPECT_EQ(bm.NumCachedTokens(a), 0);
  ASSERT_TRUE(bm.Free(2).ok());
  EXPECT_EQ(Alloc(bm, 3, a), 0);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, HashCollisionNeverReturnsWrongBlocks) {
  // Every block hashes alike: only the token comparison tells them apart.
  BlockManager bm =
      Make(16, true, [](uint64_t, absl::Span<const TokenId>) { return 7u; });
  Alloc(bm, 1, Range(0, 2 * kBlockSize + 1));
  EXPECT_EQ(bm.stats().num_cached_blocks, 1);  // The second collided.
  EXPECT_EQ(Alloc(bm, 2, Range(100, 2 * kBlockSize + 1)), 0);
  EXPECT_EQ(Alloc(bm, 3, Range(0, 2 * kBlockSize + 1)), kBlockSize);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

// Hashes only the first token of a block, so that {0, 1, 2, 3} and
// {0, 9, 9, 9} collide as roots (and so do their children).
uint64_t FirstTokenHash(uint64_t parent, absl::Span<const TokenId> tokens) {
  return BlockManager::DefaultBlockHash(parent, tokens.subspan(0, 1));
}

TEST(BlockManagerTest, CollidingRootStopsRegistrationBelowIt) {
  BlockManager bm = Make(16, true, FirstTokenHash);
  const std::vector<TokenId> root_a = {0, 1, 2, 3};
  const std::vector<TokenId> root_b = {0, 9, 9, 9};
  const auto child = Range(20, kBlockSize);
  const auto prompt_a = Concat(Concat(root_a, child), {5});
  const auto prompt_b = Concat(Concat(root_b, child), {5});
  EXPECT_EQ(Alloc(bm, 1, prompt_a), 0);
  // B's root collides with A's: a miss, and B's child (same tokens as A's,
  // same chained hash) must not be registered as if it followed A's root.
  EXPECT_EQ(Alloc(bm, 2, prompt_b), 0);
  EXPECT_EQ(bm.stats().num_cached_blocks, 2);
  EXPECT_EQ(bm.NumCachedTokens(prompt_b), 0);
  EXPECT_EQ(bm.NumCachedTokens(prompt_a), 2 * kBlockSize);
  EXPECT_EQ(Alloc(bm, 3, prompt_a), 2 * kBlockSize);
  EXPECT_EQ(Table(bm, 3)[1], Table(bm, 1)[1]);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, ChildOfAnEvictedParentNeverHits) {
  BlockManager bm = Make(8, true, FirstTokenHash);
  const std::vector<TokenId> root_a = {0, 1, 2, 3};
  const std::vector<TokenId> root_b = {0, 9, 9, 9};
  const auto child = Range(20, kBlockSize);
  // Sequence 1 caches root A (block 0).
  Alloc(bm, 1, Concat(root_a, {5}));
  // Sequence 2 computes root A again by chunks (a duplicate, chained through
  // block 0's registration) and caches a child under it in its own block,
  // which it keeps after block 0 is released.
  Alloc(bm, 2, {0, 1, 2});
  ASSERT_TRUE(*bm.AppendSlots(2, {3}));
  ASSERT_TRUE(*bm.AppendSlots(2, Concat(child, {5})));
  EXPECT_EQ(bm.NumCachedTokens(Concat(Concat(root_a, child), {5})),
            2 * kBlockSize);
  const BlockId child_block = Table(bm, 2)[1];
  ASSERT_TRUE(bm.Free(1).ok());
  // Evict root A: a filler pops every free block, then gives them back.
  Alloc(bm, 3, Range(100, 5 * kBlockSize));
  ASSERT_TRUE(bm.Free(3).ok());
  EXPECT_EQ(bm.NumCachedTokens(Concat(root_a, {5})), 0);
  // Root B now takes root A's old hash. The child hashes the same under it
  // and has the same tokens, but was computed after root A: a miss.
  Alloc(bm, 4, Concat(root_b, {5}));
  EXPECT_EQ(bm.NumCachedTokens(Concat(Concat(root_b, child), {5})), kBlockSize);
  auto r = bm.AllocateSequence(5, Concat(Concat(root_b, child), {5}));
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(**r, kBlockSize);
  EXPECT_NE(Table(bm, 5)[1], child_block);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, PrefixCachingDisabledSharesNothing) {
  BlockManager bm = Make(16, false);
  const auto prompt = Range(0, 3 * kBlockSize + 1);
  EXPECT_EQ(Alloc(bm, 1, prompt), 0);
  EXPECT_EQ(Alloc(bm, 2, prompt), 0);
  EXPECT_EQ(bm.stats().num_cached_blocks, 0);
  EXPECT_EQ(bm.stats().num_used_blocks, 8);
  EXPECT_EQ(bm.stats().queried_tokens, 0);
  EXPECT_EQ(bm.NumCachedTokens(prompt), 0);
  for (BlockId b : Table(bm, 1)) EXPECT_EQ(bm.RefCount(b), 1);
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

// A few thousand random allocations (from a few shared prefixes), appends and
// frees, checking every invariant after each, and that a shared block always
// stands for the same token prefix in every table that holds it (so a hit
// never hands out KV computed for other tokens).
void RunRandomizedOperations(BlockManager::HashFn hash_fn) {
  std::mt19937 rng(1234);
  BlockManager bm = Make(48, true, std::move(hash_fn));
  // Prompts are drawn from a few shared prefixes so that hits, sharing,
  // touches of queued blocks and lazy eviction all happen often.
  std::vector<std::vector<TokenId>> prefixes;
  for (int p = 0; p < 4; ++p) {
    prefixes.push_back(Range(1000 * p, (p + 1) * kBlockSize + p));
  }
  std::map<SeqId, std::vector<TokenId>> live;
  SeqId next_id = 0;
  int allocated = 0, refused = 0, hits = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 4 || live.empty()) {
      auto prompt = prefixes[rng() % prefixes.size()];
      const int extra = std::uniform_int_distribution<int>(0, 9)(rng);
      for (int i = 0; i < extra; ++i) prompt.push_back(rng() % 3);
      if (prompt.empty()) prompt.push_back(1);
      const int expected_cached = bm.NumCachedTokens(prompt);
      auto r = bm.AllocateSequence(next_id, prompt);
      ASSERT_TRUE(r.ok()) << r.status();
      if (r->has_value()) {
        ++allocated;
        ASSERT_EQ(**r, expected_cached);
        ASSERT_EQ(**r % kBlockSize, 0);
        ASSERT_LT(**r, static_cast<int>(prompt.size()));
        hits += **r > 0;
        live[next_id] = prompt;
      } else {
        ++refused;
        ASSERT_FALSE(bm.HasSequence(next_id));
      }
      ++next_id;
    } else if (op < 7) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const int n = std::uniform_int_distribution<int>(1, 6)(rng);
      std::vector<TokenId> tokens;
      for (int i = 0; i < n; ++i) tokens.push_back(rng() % 3);
      const bool can = *bm.CanAppendSlots(it->first, n);
      auto r = bm.AppendSlots(it->first, tokens);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(*r, can);
      if (*r) {
        it->second.insert(it->second.end(), tokens.begin(), tokens.end());
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(bm.Free(it->first).ok());
      live.erase(it);
    }
    ASSERT_TRUE(bm.CheckConsistency().ok())
        << "step " << step << ": " << bm.CheckConsistency();
    const auto s = bm.stats();
    ASSERT_EQ(s.num_free_blocks + s.num_used_blocks, bm.num_blocks());
    for (const auto& [id, tokens] : live) {
      ASSERT_EQ(*bm.NumTokens(id), static_cast<int64_t>(tokens.size()));
      const auto table = Table(bm, id);
      ASSERT_EQ(table.size(), (tokens.size() + kBlockSize - 1) / kBlockSize);
      for (BlockId b : table) ASSERT_GT(bm.RefCount(b), 0);
    }
    std::map<BlockId, std::vector<TokenId>> block_prefix;
    for (const auto& [id, tokens] : live) {
      const auto table = Table(bm, id);
      for (size_t j = 0; j < table.size(); ++j) {
        const size_t end = std::min(tokens.size(), (j + 1) * kBlockSize);
        std::vector<TokenId> prefix(tokens.begin(), tokens.begin() + end);
        auto [it, inserted] = block_prefix.emplace(table[j], prefix);
        ASSERT_TRUE(inserted || it->second == prefix)
            << "step " << step << ": block " << table[j]
            << " shared by different prefixes";
      }
    }
  }
  // The mix must actually have exercised the interesting paths.
  EXPECT_GT(allocated, 100);
  EXPECT_GT(refused, 0);
  EXPECT_GT(hits, 50);
  for (const auto& [id, tokens] : live) ASSERT_TRUE(bm.Free(id).ok());
  EXPECT_EQ(bm.stats().num_free_blocks, bm.num_blocks());
  EXPECT_TRUE(bm.CheckConsistency().ok());
}

TEST(BlockManagerTest, RandomizedOperationsKeepInvariants) {
  RunRandomizedOperations(nullptr);
}

TEST(BlockManagerTest, RandomizedOperationsWithCollidingHashes) {
  // Most blocks collide: the verification paths run constantly.
  RunRandomizedOperations(FirstTokenHash);
}

}  // namespace
}  // namespace tessera
