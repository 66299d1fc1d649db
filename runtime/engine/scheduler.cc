#include "runtime/engine/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "runtime/kv/block_manager.h"

namespace tessera {
namespace {

absl::Status UnknownSequence(SeqId seq_id) {
  return absl::NotFoundError(
      absl::StrCat("scheduler: unknown sequence ", seq_id));
}

absl::Status Inconsistent(SeqId seq_id, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("scheduler: sequence ", seq_id, ": ", what));
}

}  // namespace

absl::StatusOr<Scheduler> Scheduler::Create(SchedulerConfig config,
                                            BlockManager* blocks) {
  if (blocks == nullptr) {
    return absl::InvalidArgumentError("scheduler: no block manager");
  }
  if (config.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: max_num_seqs must be at least 1, got ",
                     config.max_num_seqs));
  }
  if (config.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: max_num_batched_tokens must be at least 1, got ",
        config.max_num_batched_tokens));
  }
  if (config.recompute_at_length < 0 ||
      (config.recompute_at_length > 0 && blocks->prefix_caching_enabled())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: recompute_at_length ", config.recompute_at_length,
        " needs prefix caching off (a recomputed sequence would reuse its "
        "own cached blocks)"));
  }
  return Scheduler(config, blocks);
}

Scheduler::Scheduler(SchedulerConfig config, BlockManager* blocks)
    : config_(config), blocks_(blocks) {}

absl::Status Scheduler::Add(SeqId seq_id, std::vector<TokenId> prompt,
                            int64_t max_total_tokens) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: sequence ", seq_id, " has an empty prompt"));
  }
  if (seqs_.contains(seq_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: sequence ", seq_id, " already exists"));
  }
  const int64_t prompt_size = static_cast<int64_t>(prompt.size());
  if (max_total_tokens < prompt_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: sequence ", seq_id, ": max_total_tokens ", max_total_tokens,
        " is below its prompt's ", prompt_size, " tokens"));
  }
  // Written so that a huge max_total_tokens cannot overflow.
  const int64_t block_size = blocks_->block_size();
  const int64_t blocks_needed =
      max_total_tokens / block_size + (max_total_tokens % block_size != 0);
  if (blocks_needed > blocks_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: sequence ", seq_id, " may hold ", max_total_tokens,
        " tokens, which need ", blocks_needed, " KV blocks of ", block_size,
        " tokens, but the pool has only ", blocks_->num_blocks(), " blocks"));
  }
  Sequence seq;
  seq.tokens = std::move(prompt);
  seq.max_total_tokens = max_total_tokens;
  seqs_.emplace(seq_id, std::move(seq));
  waiting_.push_back(seq_id);
  return absl::OkStatus();
}

absl::Status Scheduler::PreemptNewest(std::vector<ScheduledSequence>& scheduled,
                                      int64_t& budget,
                                      SchedulerOutput& output) {
  if (running_.empty()) {
    return absl::InternalError("scheduler: nothing running to preempt");
  }
  const SeqId victim = running_.back();
  auto it = seqs_.find(victim);
  if (it == seqs_.end()) return Inconsistent(victim, "running but unknown");
  if (absl::Status s = blocks_->Free(victim); !s.ok()) return s;
  running_.pop_back();
  Sequence& seq = it->second;
  seq.num_computed = 0;
  seq.running = false;
  // Front of the queue: preemption takes the newest first, so several
  // victims end up oldest first.
  waiting_.push_front(victim);
  // The victim may have been scheduled earlier in this call (it cannot with
  // the oldest-first running pass, but the output must never name a
  // sequence that no longer holds its blocks).
  auto entry = std::find_if(
      scheduled.begin(), scheduled.end(),
      [victim](const ScheduledSequence& s) { return s.seq_id == victim; });
  if (entry != scheduled.end()) {
    budget += entry->num_tokens;
    scheduled.erase(entry);
  }
  output.preempted.push_back(victim);
  ++stats_.preemptions;
  return absl::OkStatus();
}

absl::Status Scheduler::Recompute(size_t i) {
  const SeqId id = running_[i];
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return Inconsistent(id, "running but unknown");
  if (absl::Status s = blocks_->Free(id); !s.ok()) return s;
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  Sequence& seq = it->second;
  seq.num_computed = 0;
  seq.running = false;
  seq.recomputed = true;
  waiting_.push_front(id);
  ++stats_.recomputes;
  return absl::OkStatus();
}

absl::Status Scheduler::AdmitWaiting(std::vector<ScheduledSequence>& scheduled,
                                     int64_t& budget) {
  while (!waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs &&
         budget > 0) {
    const SeqId id = waiting_.front();
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return Inconsistent(id, "waiting but unknown");
    Sequence& seq = it->second;
    const auto tokens = absl::MakeConstSpan(seq.tokens);
    const int64_t size = static_cast<int64_t>(tokens.size());
    const int64_t cached = blocks_->NumCachedTokens(tokens);
    // cached <= size - 1, so the chunk is never empty.
    const int64_t n = std::min(size - cached, budget);
    absl::StatusOr<std::optional<int>> r =
        blocks_->AllocateSequence(id, tokens.subspan(0, cached + n));
    if (!r.ok()) return r.status();
    if (!r->has_value()) break;  // FIFO: nobody behind it skips ahead.
    if (**r != cached) {
      const int64_t got = **r;
      blocks_->Free(id).IgnoreError();
      return Inconsistent(id, absl::StrCat("the block manager found ", got,
                                           " cached tokens, not ", cached));
    }
    waiting_.pop_front();
    running_.push_back(id);
    seq.running = true;
    seq.num_computed = cached + n;
    budget -= n;
    ScheduledSequence s;
    s.seq_id = id;
    s.context_len = cached;
    s.num_tokens = n;
    s.sample = seq.num_computed == size;
    s.first_chunk = true;
    scheduled.push_back(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<SchedulerOutput> Scheduler::Schedule() {
  SchedulerOutput output;
  std::vector<ScheduledSequence> scheduled;
  int64_t budget = config_.max_num_batched_tokens;

  // Running sequences, oldest first. A preemption removes running_.back(),
  // which is never before index i.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    const SeqId id = running_[i];
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return Inconsistent(id, "running but unknown");
    Sequence& seq = it->second;
    const int64_t remaining =
        static_cast<int64_t>(seq.tokens.size()) - seq.num_computed;
    if (remaining <= 0) {  // Sampled, and no token appended (yet).
      ++i;
      continue;
    }
    // About to decode token L + 1 with L tokens computed at lengths <= L:
    // recompute it whole (admission below takes it first, this step).
    if (remaining == 1 && !seq.recomputed && config_.recompute_at_length > 0 &&
        static_cast<int64_t>(seq.tokens.size()) ==
            config_.recompute_at_length + 1) {
      if (absl::Status s = Recompute(i); !s.ok()) return s;
      continue;  // running_[i] is the next sequence now.
    }
    while (true) {
      const int64_t n = std::min(remaining, budget);
      const auto chunk =
          absl::MakeConstSpan(seq.tokens).subspan(seq.num_computed, n);
      absl::StatusOr<bool> appended = blocks_->AppendSlots(id, chunk);
      if (!appended.ok()) return appended.status();
      if (*appended) {
        ScheduledSequence s;
        s.seq_id = id;
        s.context_len = seq.num_computed;
        s.num_tokens = n;
        seq.num_computed += n;
        s.sample = seq.num_computed == static_cast<int64_t>(seq.tokens.size());
        scheduled.push_back(s);
        budget -= n;
        ++i;
        break;
      }
      // Out of blocks: preempt the newest running sequence and retry; if
      // the needy sequence is the newest, it is the one preempted.
      const bool self = running_.back() == id;
      if (absl::Status s = PreemptNewest(scheduled, budget, output); !s.ok()) {
        return s;
      }
      if (self) break;  // i == running_.size() now.
    }
  }

  // Waiting sequences, unless this step preempted (the pool is tight).
  if (output.preempted.empty()) {
    if (absl::Status s = AdmitWaiting(scheduled, budget); !s.ok()) return s;
  }

  // Decodes first, then the rest, each group in scheduling order.
  std::stable_partition(
      scheduled.begin(), scheduled.end(),
      [](const ScheduledSequence& s) { return s.num_tokens == 1; });
  for (const ScheduledSequence& s : scheduled)
    output.num_tokens += s.num_tokens;
  output.seqs = std::move(scheduled);
  if (!output.seqs.empty()) {
    ++stats_.steps;
    stats_.max_batch =
        std::max(stats_.max_batch, static_cast<int64_t>(output.seqs.size()));
  }
  return output;
}

absl::Status Scheduler::AppendToken(SeqId seq_id, TokenId token) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return UnknownSequence(seq_id);
  Sequence& seq = it->second;
  const int64_t size = static_cast<int64_t>(seq.tokens.size());
  if (!seq.running || seq.num_computed != size) {
    return absl::FailedPreconditionError(
        absl::StrCat("scheduler: sequence ", seq_id, " was not just sampled (",
                     seq.num_computed, " of its ", size, " tokens computed, ",
                     seq.running ? "running" : "waiting", ")"));
  }
  if (size >= seq.max_total_tokens) {
    return absl::OutOfRangeError(absl::StrCat(
        "scheduler: sequence ", seq_id, " already holds its max_total_tokens ",
        seq.max_total_tokens, " tokens"));
  }
  seq.tokens.push_back(token);
  return absl::OkStatus();
}

absl::Status Scheduler::Remove(SeqId seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return UnknownSequence(seq_id);
  if (it->second.running) {
    auto pos = std::find(running_.begin(), running_.end(), seq_id);
    if (pos == running_.end()) {
      return Inconsistent(seq_id, "marked running but not in the queue");
    }
    if (absl::Status s = blocks_->Free(seq_id); !s.ok()) return s;
    running_.erase(pos);
  } else {
    auto pos = std::find(waiting_.begin(), waiting_.end(), seq_id);
    if (pos == waiting_.end()) {
      return Inconsistent(seq_id, "marked waiting but not in the queue");
    }
    waiting_.erase(pos);
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

bool Scheduler::Contains(SeqId seq_id) const { return seqs_.contains(seq_id); }

absl::StatusOr<absl::Span<const TokenId>> Scheduler::Tokens(
    SeqId seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return UnknownSequence(seq_id);
  return absl::MakeConstSpan(it->second.tokens);
}

absl::StatusOr<absl::Span<const BlockId>> Scheduler::BlockTable(
    SeqId seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return UnknownSequence(seq_id);
  if (!it->second.running) return absl::Span<const BlockId>();
  return blocks_->BlockTable(seq_id);
}

}  // namespace tessera
