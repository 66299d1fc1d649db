#include "runtime/executor/grammar_masks.h"

#include <algorithm>
#include <utility>

namespace tessera {

GrammarMaskPool::GrammarMaskPool(int threads)
    : max_threads_(std::max(1, threads)) {}

GrammarMaskPool::~GrammarMaskPool() {
  Wait();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void GrammarMaskPool::Start(std::vector<Job> jobs) {
  Wait();
  if (jobs.empty()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A thread woken for the last Start may only now be entering Drain.
    done_.wait(lock, [&] { return active_ == 0; });
    jobs_ = std::move(jobs);
    next_.store(0);
    finished_ = 0;
    ++generation_;
    running_ = true;
    // One thread per job, up to the bound: small batches wake few.
    while (static_cast<int>(threads_.size()) <
           std::min<int>(max_threads_, static_cast<int>(jobs_.size()))) {
      threads_.emplace_back([this] { Worker(); });
    }
  }
  wake_.notify_all();
}

void GrammarMaskPool::Drain() {
  // jobs_ is only replaced when no thread is in here (Wait sees active_ 0).
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++active_;
  }
  const size_t n = jobs_.size();
  while (true) {
    const size_t i = next_.fetch_add(1);
    if (i >= n) break;
    Job& job = jobs_[i];
    *job.status = job.matcher->FillNextTokenMask(job.mask);
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (--active_ == 0) done_.notify_all();
}

void GrammarMaskPool::Wait() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
  }
  Drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == jobs_.size() && active_ == 0; });
  running_ = false;
}

void GrammarMaskPool::Worker() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain();
  }
}

}  // namespace tessera
