// BlockManager: the paged-KV bookkeeping of the continuous-batching scheduler.
//
// It hands out block ids (never memory): a sequence's KV lives in the blocks of
// its block table, `block_size` tokens per block, and token `p` is written to
// slot `block_table[p / block_size] * block_size + p % block_size`.
//
// Prefix caching. A full block is identified by a chained hash of its tokens
// and its parent's hash, so equal hashes mean equal prefixes up to the block's
// end. A new sequence reuses the longest run of cached full blocks that starts
// its prompt; those blocks are shared (reference counted), not copied. Hashes
// are only a lookup key: a hit is accepted only if the block's stored token ids
// equal the prompt's and the block was registered under exactly the cached
// parent block matched one level up (a per-registration id, so a parent that
// was evicted and re-registered, or a 64-bit collision anywhere up the chain,
// is a miss, never wrong KV).
//
// A full block becomes shareable as soon as its slots are handed out. That is
// sound because the caller writes the KV of every slot it was given in the
// same step (each layer writes the whole step's KV before its attention reads
// any). A scheduler that chunks a prefill therefore allocates by chunk: it
// asks NumCachedTokens(prompt) first, then AllocateSequence with the cached
// prefix plus the first chunk, then AppendSlots with each later chunk.
//
// Eviction order. Free blocks sit in one intrusive doubly-linked queue (int32
// prev/next in a flat array, with head and tail sentinels; every operation is
// O(1)). Allocation takes the FRONT; a block whose reference count drops to 0
// goes to the BACK. So a block is evicted least-recently-released first (LRU
// by release time); blocks released together keep their release order, and
// Free releases a sequence's blocks last block first, so that a shared prefix
// outlives its tails (a child is useless without its parent). A released
// block keeps its hash and stays hittable until it is popped for reuse (lazy
// eviction): only then is its hash entry dropped. A hit on a queued block
// takes it out of the queue (touch).
//
// "Cannot allocate" is a value (nullopt / false, with nothing changed), never
// an error, so the scheduler can preempt; errors are reserved for misuse
// (unknown or duplicate sequence ids, bad arguments).
//
// Stability: block ids are stable for as long as a sequence holds them. A span
// returned by BlockTable stays valid until the next call that changes that
// sequence (AppendSlots, Free).
//
// Thread safety: none. Only rank 0's scheduler thread uses it.
#ifndef TESSERA_RUNTIME_KV_BLOCK_MANAGER_H_
#define TESSERA_RUNTIME_KV_BLOCK_MANAGER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/core/ids.h"

namespace tessera {

class BlockManager {
 public:
  // hash(parent_hash, tokens of one full block). The result 0 is reserved for
  // "no hash" and is remapped. Replaceable only so tests can force collisions.
  using HashFn =
      std::function<uint64_t(uint64_t parent_hash, absl::Span<const TokenId>)>;

  struct Options {
    int num_blocks = 0;
    int block_size = 16;  // Tokens per block.
    bool enable_prefix_caching = true;
    HashFn hash_fn;  // Empty: the default 64-bit mix (DefaultBlockHash).
  };

  struct Stats {
    int num_free_blocks = 0;     // In the free queue (may still be cached).
    int num_used_blocks = 0;     // Reference count > 0.
    int num_cached_blocks = 0;   // Registered in the prefix cache.
    int64_t hit_tokens = 0;      // Prompt tokens served from the cache.
    int64_t queried_tokens = 0;  // Prompt tokens looked up.
  };

  // InvalidArgument unless 0 < num_blocks < 2^31 - 2 and block_size > 0.
  static absl::StatusOr<BlockManager> Create(Options options);

  static uint64_t DefaultBlockHash(uint64_t parent_hash,
                                   absl::Span<const TokenId> tokens);

  BlockManager(BlockManager&&) = default;
  BlockManager& operator=(BlockManager&&) = default;
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  // Number of leading tokens of `tokens` that AllocateSequence would find in
  // the prefix cache now: a multiple of block_size, and at most
  // tokens.size() - 1 (the last token is always recomputed so that its
  // logits exist). No side effects; 0 when prefix caching is off.
  int NumCachedTokens(absl::Span<const TokenId> tokens) const;

  // Whether a new sequence of `num_tokens` fits in the free blocks, counting
  // no cache hits (conservative: AllocateSequence may need fewer).
  bool CanAllocate(int64_t num_tokens) const;

  // Gives `seq_id` slots for `tokens` (its prompt, or the cached prefix plus a
  // first chunk), reusing cached full blocks. Returns the number of leading
  // tokens whose KV is already computed (see NumCachedTokens), or nullopt when
  // the free blocks do not suffice, in which case nothing changed (statistics
  // included). InvalidArgument if `seq_id` is already allocated or `tokens` is
  // empty.
  absl::StatusOr<std::optional<int>> AllocateSequence(
      SeqId seq_id, absl::Span<const TokenId> tokens);

  // Gives `seq_id` slots for `new_tokens` after its current tokens (decode
  // steps, later prefill chunks), taking new blocks as the last one fills and
  // registering every block that becomes full. Returns false, with nothing
  // changed, when the free blocks do not suffice. NotFound for an unknown
  // sequence.
  absl::StatusOr<bool> AppendSlots(SeqId seq_id,
                                   absl::Span<const TokenId> new_tokens);

  // Whether AppendSlots(seq_id, <num_new_tokens tokens>) would succeed now.
  absl::StatusOr<bool> CanAppendSlots(SeqId seq_id,
                                      int64_t num_new_tokens) const;

  // Releases the sequence's blocks (see the eviction order above). NotFound
  // for an unknown sequence.
  absl::Status Free(SeqId seq_id);

  bool HasSequence(SeqId seq_id) const;
  // Tokens given slots so far. NotFound for an unknown sequence.
  absl::StatusOr<int64_t> NumTokens(SeqId seq_id) const;
  // The sequence's block ids in order. NotFound for an unknown sequence.
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(SeqId seq_id) const;
  // block_id * block_size + offset of token `position`. NotFound for an
  // unknown sequence, OutOfRange unless 0 <= position < NumTokens.
  absl::StatusOr<int64_t> SlotMapping(SeqId seq_id, int64_t position) const;

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  Stats stats() const;
  // Reference count of a block (tests, debugging). -1 for a bad id.
  int RefCount(BlockId block_id) const;

  // Checks every invariant in O(num_blocks + tokens): each block is queued
  // iff its reference count is 0, the queue links are consistent and its
  // length matches, reference counts equal the number of tables holding the
  // block, no table holds a block twice, cache entries point at blocks
  // carrying that hash. Internal on the first violation.
  absl::Status CheckConsistency() const;

 private:
  static constexpr int32_t kNone = -1;

  // One record per block plus the two queue sentinels, in one flat array.
  struct Block {
    int32_t prev = kNone;  // Free-queue links; kNone when not queued.
    int32_t next = kNone;
    int32_t ref_count = 0;
    int32_t num_tokens = 0;  // Slots in use (as last written).
    uint64_t hash = 0;       // 0: not in the prefix cache.
    // Unique per registration, and the parent's at registration time: a hit
    // must follow exactly these links, see the file comment.
    uint64_t cache_id = 0;
    uint64_t parent_cache_id = 0;
  };

  struct Sequence {
    std::vector<BlockId> blocks;
    std::vector<TokenId> tokens;
    // Leading full blocks already considered for registration.
    int num_registered_blocks = 0;
    // The chain at the end of those blocks: the last full block's hash and
    // cache id (0, 0 at the start).
    uint64_t chain_hash = 0;
    uint64_t chain_cache_id = 0;
    // A collision left a block unregistered; registering its descendants
    // would link them under the wrong parent, so the chain stops there.
    bool chain_broken = false;
  };

  // The cached prefix of `tokens`: its blocks and the chain at its end.
  struct Match {
    std::vector<BlockId> blocks;
    uint64_t chain_hash = 0;
    uint64_t chain_cache_id = 0;
  };

  explicit BlockManager(Options options);

  uint64_t HashBlock(uint64_t parent_hash,
                     absl::Span<const TokenId> tokens) const;
  Match FindCachedPrefix(absl::Span<const TokenId> tokens) const;
  int64_t BlocksFor(int64_t num_tokens) const;

  int32_t head() const { return num_blocks_; }
  int32_t tail() const { return num_blocks_ + 1; }
  bool InQueue(BlockId id) const { return blocks_[id].prev != kNone; }
  void QueueRemove(BlockId id);
  void QueuePushBack(BlockId id);
  // Pops the least recently released block and drops its old hash entry.
  BlockId PopFreeBlock();
  void Uncache(BlockId id);
  void RegisterFullBlocks(Sequence& seq);
  void SetTokenCounts(const Sequence& seq, size_t first_block);

  int num_blocks_;
  int block_size_;
  bool enable_prefix_caching_;
  HashFn hash_fn_;

  std::vector<Block> blocks_;  // num_blocks_ + 2 (head, tail sentinels).
  int num_free_ = 0;
  // Token ids of each cached block, block_size_ per block, for verification.
  std::vector<TokenId> cached_tokens_;
  absl::flat_hash_map<uint64_t, BlockId> hash_to_block_;
  uint64_t next_cache_id_ = 1;
  absl::flat_hash_map<SeqId, Sequence> sequences_;
  int64_t hit_tokens_ = 0;
  int64_t queried_tokens_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_KV_BLOCK_MANAGER_H_
