// Scheduler: rank 0's continuous-batching policy. Each call to Schedule()
// decides what the next step computes; the engine turns that into a StepPlan.
//
// Policy (vLLM's, with chunked prefill always on):
//  - A per-step token budget (max_num_batched_tokens) and at most max_num_seqs
//    sequences holding KV at once.
//  - Running sequences first, oldest first: each gets the tokens it has not
//    computed yet (1 for a decode; the rest of its prompt, chunked to the
//    remaining budget, for a prefill in progress).
//  - When a running sequence cannot get KV slots, the NEWEST running sequence
//    is preempted by recompute: its blocks are freed, its computed-token count
//    drops to 0 and it goes back to the FRONT of the waiting queue, keeping
//    every token it has (prompt and generated), so nothing is lost. If the
//    sequence that needs slots is itself the newest, it is the one preempted.
//  - Then waiting sequences in FIFO order while budget, max_num_seqs and free
//    blocks allow. Admission asks the block manager for the cached prefix
//    first and allocates the cached prefix plus the first chunk only (see
//    block_manager.h on why prefills allocate by chunk). A waiting sequence
//    that does not fit stops admission (no skipping: FIFO).
//  - No admission in a step that preempted (the pool is tight).
//  - With recompute_at_length (Phi-3's LongRoPE), a sequence reaching that
//    length is recomputed whole once (see SchedulerConfig).
//
// A sequence's tokens are everything it has: prompt, then each token the
// engine appends after sampling. A scheduled chunk that reaches the end of
// those tokens is sampled (`sample`); a partial prefill chunk is not.
//
// The scheduler never touches tensors; it only hands out token ranges and
// block ids. Thread safety: none (rank 0's step loop).
#ifndef TESSERA_RUNTIME_ENGINE_SCHEDULER_H_
#define TESSERA_RUNTIME_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/core/ids.h"
#include "runtime/kv/block_manager.h"

namespace tessera {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  // > 0: a running sequence about to decode its (L + 1)-th token, L =
  // recompute_at_length, with every earlier token's KV computed at lengths
  // <= L, is recomputed whole instead (once): its blocks are freed and it is
  // readmitted at the front of the queue, its prefill covering every token.
  // transformers' Phi3ForCausalLM drops its cache at that point so that
  // LongRoPE rotates every key with its long factors
  // (ModelConfig::recompute_at_length). Needs prefix caching off: the
  // recompute must not find its own blocks in the cache.
  int64_t recompute_at_length = 0;
};

// One sequence's part of a step.
struct ScheduledSequence {
  SeqId seq_id = 0;
  int64_t context_len = 0;  // Tokens whose KV is already in the cache.
  int64_t num_tokens = 0;   // Tokens run now: tokens[context_len, +num_tokens).
  bool sample = false;      // The chunk reaches the sequence's last token.
  // First step since admission (new, or resumed after preemption): the
  // first context_len tokens came from the prefix cache.
  bool first_chunk = false;
};

struct SchedulerOutput {
  // Decodes (num_tokens == 1) first, then the rest, each group in scheduling
  // order. Empty when nothing can run.
  std::vector<ScheduledSequence> seqs;
  std::vector<SeqId> preempted;  // Preempted during this call.
  int64_t num_tokens = 0;        // Sum of seqs[i].num_tokens.
};

class Scheduler {
 public:
  struct Stats {
    int64_t steps = 0;        // Non-empty Schedule() results.
    int64_t preemptions = 0;  // Sequences preempted, counted each time.
    int64_t max_batch = 0;    // Most sequences in one step.
    int64_t recomputes = 0;   // Sequences recomputed at recompute_at_length.
  };

  // `blocks` must outlive the scheduler; the scheduler is its only user.
  // InvalidArgument unless max_num_seqs >= 1 and max_num_batched_tokens >= 1,
  // and for a recompute_at_length with prefix caching on.
  static absl::StatusOr<Scheduler> Create(SchedulerConfig config,
                                          BlockManager* blocks);

  // Queues a sequence (FIFO). `max_total_tokens` is the most tokens it will
  // ever hold (prompt + generated); InvalidArgument if the pool could never
  // hold that many (it would wait or thrash forever), for an empty prompt, or
  // a duplicate id.
  absl::Status Add(SeqId seq_id, std::vector<TokenId> prompt,
                   int64_t max_total_tokens);

  // Picks the next step. Errors only on internal inconsistency. The output
  // may be empty while work remains when the only sequence that needed
  // blocks preempted itself (nothing is admitted in that call); the next call
  // readmits it.
  absl::StatusOr<SchedulerOutput> Schedule();

  // After a step: appends the token sampled for `seq_id` (a sequence that was
  // scheduled with sample = true) so that the next step decodes it.
  // OutOfRange when the sequence already holds the max_total_tokens it was
  // added with (the pool was only checked for that many).
  absl::Status AppendToken(SeqId seq_id, TokenId token);

  // Removes a sequence wherever it is (waiting or running) and frees its
  // blocks: on finish, or to cancel a request. NotFound for an unknown id.
  absl::Status Remove(SeqId seq_id);

  bool Contains(SeqId seq_id) const;
  // Every token of the sequence (prompt + generated). NotFound if unknown.
  absl::StatusOr<absl::Span<const TokenId>> Tokens(SeqId seq_id) const;
  // The block table the sequence holds now (empty while waiting).
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(SeqId seq_id) const;

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  const Stats& stats() const { return stats_; }
  const BlockManager& block_manager() const { return *blocks_; }

 private:
  struct Sequence {
    std::vector<TokenId> tokens;
    int64_t num_computed = 0;  // KV written (or scheduled to be).
    int64_t max_total_tokens = 0;
    bool running = false;
    bool recomputed = false;  // Once at recompute_at_length.
  };

  Scheduler(SchedulerConfig config, BlockManager* blocks);

  // Preempts running_.back() by recompute: frees its blocks, resets its
  // computed count and puts it at the front of the waiting queue. If it was
  // already scheduled in this call, its entry leaves `scheduled` and its
  // tokens go back to `budget`.
  absl::Status PreemptNewest(std::vector<ScheduledSequence>& scheduled,
                             int64_t& budget, SchedulerOutput& output);
  // Frees running_[i]'s blocks and puts it at the front of the waiting queue
  // with nothing computed (SchedulerConfig::recompute_at_length).
  absl::Status Recompute(size_t i);
  // Admits waiting sequences (FIFO) into `scheduled` while budget,
  // max_num_seqs and free blocks allow.
  absl::Status AdmitWaiting(std::vector<ScheduledSequence>& scheduled,
                            int64_t& budget);

  SchedulerConfig config_;
  BlockManager* blocks_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  std::deque<SeqId> waiting_;   // Front = next to admit.
  std::vector<SeqId> running_;  // Admission order: back = newest.
  Stats stats_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_SCHEDULER_H_
