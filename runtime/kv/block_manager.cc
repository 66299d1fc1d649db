#include "runtime/kv/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace tessera {
namespace {

// splitmix64's finalizer: every input bit affects every output bit, so a
// token sequence folded through it is a good 64-bit key. Deterministic (unlike
// absl::Hash, which is seeded per process), which keeps tests reproducible.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

absl::Status UnknownSequence(SeqId seq_id) {
  return absl::NotFoundError(
      absl::StrCat("sequence ", seq_id, " is not allocated in the KV cache"));
}

}  // namespace

uint64_t BlockManager::DefaultBlockHash(uint64_t parent_hash,
                                        absl::Span<const TokenId> tokens) {
  uint64_t h = Mix(parent_hash + 0x9e3779b97f4a7c15ULL);
  for (TokenId t : tokens) {
    h = Mix(h ^ static_cast<uint32_t>(t));
  }
  // The length too, so a partial block can never equal a full one.
  return Mix(h ^ tokens.size());
}

absl::StatusOr<BlockManager> BlockManager::Create(Options options) {
  if (options.num_blocks <= 0 ||
      options.num_blocks > std::numeric_limits<int32_t>::max() - 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV block manager: num_blocks must be in [1, 2^31 - 3], got ",
        options.num_blocks));
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block manager: block_size must be positive, got ",
                     options.block_size));
  }
  return BlockManager(std::move(options));
}

BlockManager::BlockManager(Options options)
    : num_blocks_(options.num_blocks),
      block_size_(options.block_size),
      enable_prefix_caching_(options.enable_prefix_caching),
      hash_fn_(std::move(options.hash_fn)),
      blocks_(static_cast<size_t>(num_blocks_) + 2) {
  if (enable_prefix_caching_) {
    cached_tokens_.resize(static_cast<size_t>(num_blocks_) * block_size_);
  }
  // Empty queue, then every block in id order: the first allocations get
  // blocks 0, 1, 2, ... which keeps fresh block tables easy to read.
  blocks_[head()].next = tail();
  blocks_[tail()].prev = head();
  for (BlockId id = 0; id < num_blocks_; ++id) QueuePushBack(id);
}

uint64_t BlockManager::HashBlock(uint64_t parent_hash,
                                 absl::Span<const TokenId> tokens) const {
  const uint64_t h = hash_fn_ ? hash_fn_(parent_hash, tokens)
                              : DefaultBlockHash(parent_hash, tokens);
  return h == 0 ? 1 : h;  // 0 means "no hash".
}

int64_t BlockManager::BlocksFor(int64_t num_tokens) const {
  return (num_tokens + block_size_ - 1) / block_size_;
}

void BlockManager::QueueRemove(BlockId id) {
  Block& b = blocks_[id];
  blocks_[b.prev].next = b.next;
  blocks_[b.next].prev = b.prev;
  b.prev = b.next = kNone;
  --num_free_;
}

void BlockManager::QueuePushBack(BlockId id) {
  Block& b = blocks_[id];
  const int32_t last = blocks_[tail()].prev;
  b.prev = last;
  b.next = tail();
  blocks_[last].next = id;
  blocks_[tail()].prev = id;
  ++num_free_;
}

void BlockManager::Uncache(BlockId id) {
  Block& b = blocks_[id];
  if (b.hash == 0) return;
  auto it = hash_to_block_.find(b.hash);
  if (it != hash_to_block_.end() && it->second == id) hash_to_block_.erase(it);
  b.hash = 0;
  b.cache_id = 0;
  b.parent_cache_id = 0;
}

BlockId BlockManager::PopFreeBlock() {
  const BlockId id = blocks_[head()].next;
  QueueRemove(id);
  // Lazy eviction: the block stayed hittable while queued; now its content
  // is about to be overwritten.
  Uncache(id);
  blocks_[id].ref_count = 1;
  blocks_[id].num_tokens = 0;
  return id;
}

BlockManager::Match BlockManager::FindCachedPrefix(
    absl::Span<const TokenId> tokens) const {
  Match match;
  if (!enable_prefix_caching_ || tokens.empty()) return match;
  // Never the whole prompt: the last token must run through the model so
  // that its logits exist.
  const int64_t max_blocks =
      static_cast<int64_t>(tokens.size() - 1) / block_size_;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = HashBlock(match.chain_hash, block_tokens);
    auto it = hash_to_block_.find(h);
    if (it == hash_to_block_.end()) break;
    const BlockId id = it->second;
    const Block& b = blocks_[id];
    // The hash is only a key: the content and the exact parent must match.
    if (b.parent_cache_id != match.chain_cache_id) break;
    const TokenId* stored =
        cached_tokens_.data() + static_cast<size_t>(id) * block_size_;
    if (!std::equal(block_tokens.begin(), block_tokens.end(), stored)) break;
    match.blocks.push_back(id);
    match.chain_hash = h;
    match.chain_cache_id = b.cache_id;
  }
  return match;
}

int BlockManager::NumCachedTokens(absl::Span<const TokenId> tokens) const {
  return static_cast<int>(FindCachedPrefix(tokens).blocks.size()) * block_size_;
}

bool BlockManager::CanAllocate(int64_t num_tokens) const {
  return num_tokens >= 0 && BlocksFor(num_tokens) <= num_free_;
}

void BlockManager::RegisterFullBlocks(Sequence& seq) {
  const int64_t num_full =
      static_cast<int64_t>(seq.tokens.size()) / block_size_;
  for (int64_t j = seq.num_registered_blocks; j < num_full; ++j) {
    seq.num_registered_blocks = static_cast<int>(j + 1);
    if (!enable_prefix_caching_ || seq.chain_broken) continue;
    const auto block_tokens =
        absl::MakeConstSpan(seq.tokens).subspan(j * block_size_, block_size_);
    const uint64_t h = HashBlock(seq.chain_hash, block_tokens);
    const BlockId id = seq.blocks[j];
    auto it = hash_to_block_.find(h);
    if (it != hash_to_block_.end() && it->second != id) {
      const BlockId other = it->second;
      const TokenId* stored =
          cached_tokens_.data() + static_cast<size_t>(other) * block_size_;
      if (!std::equal(block_tokens.begin(), block_tokens.end(), stored)) {
        // A true collision: this block cannot be cached, and its
        // descendants cannot be linked to a cached parent.
        seq.chain_broken = true;
        continue;
      }
      if (blocks_[other].parent_cache_id == seq.chain_cache_id) {
        // The same block was computed twice (both sequences missed at once).
        // Keep the cached copy and chain through it: equal content under the
        // same parent is equal KV.
        seq.chain_hash = h;
        seq.chain_cache_id = blocks_[other].cache_id;
        continue;
      }
      // Same tokens under a different parent registration: the cached entry
      // hangs off a parent that has since been evicted (or a colliding one).
      // The fresh block replaces it.
      Uncache(other);
    }
    Block& b = blocks_[id];
    if (b.hash == 0) {
      b.hash = h;
      b.cache_id = next_cache_id_++;
      b.parent_cache_id = seq.chain_cache_id;
      std::copy(block_tokens.begin(), block_tokens.end(),
                cached_tokens_.begin() + static_cast<size_t>(id) * block_size_);
      hash_to_block_[h] = id;
    }
    seq.chain_hash = h;
    seq.chain_cache_id = b.cache_id;
  }
}

void BlockManager::SetTokenCounts(const Sequence& seq, size_t first_block) {
  const int64_t n = static_cast<int64_t>(seq.tokens.size());
  for (size_t j = first_block; j < seq.blocks.size(); ++j) {
    const int64_t in_block = n - static_cast<int64_t>(j) * block_size_;
    blocks_[seq.blocks[j]].num_tokens =
        static_cast<int32_t>(std::min<int64_t>(in_block, block_size_));
  }
}

absl::StatusOr<std::optional<int>> BlockManager::AllocateSequence(
    SeqId seq_id, absl::Span<const TokenId> tokens) {
  if (sequences_.contains(seq_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", seq_id, " is already allocated in the KV cache"));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", seq_id, ": cannot allocate KV for an empty prompt"));
  }
  Match match = FindCachedPrefix(tokens);
  // A hit on a queued block takes it out of the queue, so it no longer
  // counts as free for the blocks still to be taken.
  int64_t hits_in_queue = 0;
  for (BlockId id : match.blocks) hits_in_queue += InQueue(id) ? 1 : 0;
  const int64_t num_new = BlocksFor(static_cast<int64_t>(tokens.size())) -
                          static_cast<int64_t>(match.blocks.size());
  if (num_new > num_free_ - hits_in_queue) return std::optional<int>();

  Sequence seq;
  seq.blocks.reserve(match.blocks.size() + num_new);
  for (BlockId id : match.blocks) {
    if (InQueue(id)) QueueRemove(id);  // touch()
    ++blocks_[id].ref_count;
    seq.blocks.push_back(id);
  }
  for (int64_t i = 0; i < num_new; ++i) seq.blocks.push_back(PopFreeBlock());
  seq.tokens.assign(tokens.begin(), tokens.end());
  seq.num_registered_blocks = static_cast<int>(match.blocks.size());
  seq.chain_hash = match.chain_hash;
  seq.chain_cache_id = match.chain_cache_id;
  SetTokenCounts(seq, match.blocks.size());
  RegisterFullBlocks(seq);

  const int cached = static_cast<int>(match.blocks.size()) * block_size_;
  if (enable_prefix_caching_) {
    queried_tokens_ += static_cast<int64_t>(tokens.size());
    hit_tokens_ += cached;
  }
  sequences_.emplace(seq_id, std::move(seq));
  return std::optional<int>(cached);
}

absl::StatusOr<bool> BlockManager::CanAppendSlots(
    SeqId seq_id, int64_t num_new_tokens) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  if (num_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", seq_id, ": negative token count ", num_new_tokens));
  }
  const Sequence& seq = it->second;
  const int64_t needed =
      BlocksFor(static_cast<int64_t>(seq.tokens.size()) + num_new_tokens) -
      static_cast<int64_t>(seq.blocks.size());
  return needed <= num_free_;
}

absl::StatusOr<bool> BlockManager::AppendSlots(
    SeqId seq_id, absl::Span<const TokenId> new_tokens) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  Sequence& seq = it->second;
  const int64_t needed =
      BlocksFor(static_cast<int64_t>(seq.tokens.size() + new_tokens.size())) -
      static_cast<int64_t>(seq.blocks.size());
  if (needed > num_free_) return false;
  // The last block before the append may be partial: its count changes too.
  const size_t first_changed = seq.tokens.size() / block_size_;
  for (int64_t i = 0; i < needed; ++i) seq.blocks.push_back(PopFreeBlock());
  seq.tokens.insert(seq.tokens.end(), new_tokens.begin(), new_tokens.end());
  SetTokenCounts(seq, first_changed);
  RegisterFullBlocks(seq);
  return true;
}

absl::Status BlockManager::Free(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  // Last block first: the tails reach the queue before the prefix, so they
  // are evicted before it (a cached child is unreachable without its parent).
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (--blocks_[*b].ref_count == 0) QueuePushBack(*b);
  }
  sequences_.erase(it);
  return absl::OkStatus();
}

bool BlockManager::HasSequence(SeqId seq_id) const {
  return sequences_.contains(seq_id);
}

absl::StatusOr<int64_t> BlockManager::NumTokens(SeqId seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  return static_cast<int64_t>(it->second.tokens.size());
}

absl::StatusOr<absl::Span<const BlockId>> BlockManager::BlockTable(
    SeqId seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  return absl::MakeConstSpan(it->second.blocks);
}

absl::StatusOr<int64_t> BlockManager::SlotMapping(SeqId seq_id,
                                                  int64_t position) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return UnknownSequence(seq_id);
  const Sequence& seq = it->second;
  if (position < 0 || position >= static_cast<int64_t>(seq.tokens.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence ", seq_id, ": position ", position,
                     " is outside its ", seq.tokens.size(), " tokens"));
  }
  return static_cast<int64_t>(seq.blocks[position / block_size_]) *
             block_size_ +
         position % block_size_;
}

BlockManager::Stats BlockManager::stats() const {
  Stats s;
  s.num_free_blocks = num_free_;
  s.num_used_blocks = num_blocks_ - num_free_;
  s.num_cached_blocks = static_cast<int>(hash_to_block_.size());
  s.hit_tokens = hit_tokens_;
  s.queried_tokens = queried_tokens_;
  return s;
}

int BlockManager::RefCount(BlockId block_id) const {
  if (block_id < 0 || block_id >= num_blocks_) return -1;
  return blocks_[block_id].ref_count;
}

absl::Status BlockManager::CheckConsistency() const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("KV block manager: ", parts...));
  };
  // Walk the queue: links agree both ways and every queued block is free.
  int count = 0;
  int32_t prev = head();
  for (int32_t id = blocks_[head()].next; id != tail();
       prev = id, id = blocks_[id].next) {
    if (id < 0 || id >= num_blocks_) return fail("bad queue link ", id);
    if (blocks_[id].prev != prev) return fail("broken prev link at ", id);
    if (blocks_[id].ref_count != 0) {
      return fail("queued block ", id, " has ref_count ",
                  blocks_[id].ref_count);
    }
    if (++count > num_blocks_) return fail("cycle in the free queue");
  }
  if (blocks_[tail()].prev != prev) return fail("broken tail link");
  if (count != num_free_) {
    return fail("free queue holds ", count, " blocks, counter says ",
                num_free_);
  }
  // Reference counts equal the number of tables holding each block.
  std::vector<int32_t> refs(num_blocks_, 0);
  for (const auto& [seq_id, seq] : sequences_) {
    if (static_cast<int64_t>(seq.blocks.size()) !=
        BlocksFor(static_cast<int64_t>(seq.tokens.size()))) {
      return fail("sequence ", seq_id, " has ", seq.blocks.size(),
                  " blocks for ", seq.tokens.size(), " tokens");
    }
    absl::flat_hash_set<BlockId> seen;
    for (BlockId id : seq.blocks) {
      if (!seen.insert(id).second) {
        return fail("sequence ", seq_id, " holds block ", id, " twice");
      }
      ++refs[id];
    }
  }
  for (BlockId id = 0; id < num_blocks_; ++id) {
    const Block& b = blocks_[id];
    if (b.ref_count != refs[id]) {
      return fail("block ", id, " has ref_count ", b.ref_count, " but ",
                  refs[id], " holders");
    }
    if ((b.ref_count == 0) != InQueue(id)) {
      return fail("block ", id, " is neither free nor referenced");
    }
    if (b.hash != 0) {
      auto it = hash_to_block_.find(b.hash);
      if (it == hash_to_block_.end() || it->second != id) {
        return fail("block ", id, " carries a hash the cache does not map");
      }
    }
  }
  for (const auto& [hash, id] : hash_to_block_) {
    if (blocks_[id].hash != hash) {
      return fail("cache entry for block ", id, " has a stale hash");
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
