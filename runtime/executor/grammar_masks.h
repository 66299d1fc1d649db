// GrammarMaskPool: the step's structured-output masks
// (GrammarMatcher::FillNextTokenMask, one per constrained sequence), computed
// on a few background threads while the forward runs, so that a constrained
// batch waits only for what the forward does not hide. The threads start on
// first use: a rank that never sees a grammar runs none.
#ifndef TESSERA_RUNTIME_EXECUTOR_GRAMMAR_MASKS_H_
#define TESSERA_RUNTIME_EXECUTOR_GRAMMAR_MASKS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/grammar/matcher.h"

namespace tessera {

class GrammarMaskPool {
 public:
  struct Job {
    grammar::GrammarMatcher* matcher = nullptr;
    absl::Span<uint32_t> mask;
    absl::Status* status = nullptr;  // FillNextTokenMask's result.
  };

  // At most `threads` background threads (>= 1).
  explicit GrammarMaskPool(int threads);
  ~GrammarMaskPool();
  GrammarMaskPool(const GrammarMaskPool&) = delete;
  GrammarMaskPool& operator=(const GrammarMaskPool&) = delete;

  // Starts `jobs` and returns at once; the matchers, masks and statuses must
  // stay put until Wait. A Start without a Wait after the last one first
  // waits for that one.
  void Start(std::vector<Job> jobs);
  // Helps with what is left, then waits until every job of the last Start is
  // done. Returns at once when nothing was started.
  void Wait();

 private:
  void Worker();
  // Runs jobs until none is left to claim.
  void Drain();

  const int max_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<Job> jobs_;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;      // Under mu_.
  int active_ = 0;           // Under mu_: threads inside Drain.
  uint64_t generation_ = 0;  // Under mu_: bumped by each Start.
  bool running_ = false;     // A Start not yet waited for.
  bool stop_ = false;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_GRAMMAR_MASKS_H_
