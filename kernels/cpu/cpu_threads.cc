#include "kernels/cpu/cpu_threads.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace tessera {
namespace {

constexpr int kMaxThreads = 1024;

// How long an idle worker polls for the next job before it sleeps. Within a
// forward pass jobs follow each other within microseconds (waking a sleeping
// thread costs about as much); a bound keeps an idle pool off shared cores.
constexpr auto kSpinTime = std::chrono::microseconds(50);

// Whether this thread is running tasks of a job (a worker, or a caller inside
// ParallelFor): a nested ParallelFor runs inline.
thread_local bool in_job = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct CpuThreadPool::Job {
  Job(int64_t n, absl::FunctionRef<void(int64_t)> f) : num_tasks(n), fn(f) {}
  const int64_t num_tasks;
  const absl::FunctionRef<void(int64_t)> fn;
  std::atomic<int64_t> next{0};
  std::atomic<int> joined{0};  // Workers inside RunTasks of this job.
};

int CpuThreadsFor(const char* omp_num_threads, int cpus) {
  int threads = cpus;
  if (omp_num_threads != nullptr) {
    char* end = nullptr;
    const long v = std::strtol(omp_num_threads, &end, 10);
    if (end != omp_num_threads && (*end == '\0' || *end == ',') && v > 0) {
      threads = static_cast<int>(std::min<long>(v, kMaxThreads));
    }
  }
  return std::clamp(threads, 1, kMaxThreads);
}

CpuThreadPool::CpuThreadPool(int threads) {
  threads = std::clamp(threads, 1, kMaxThreads);
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

CpuThreadPool::~CpuThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

CpuThreadPool& CpuThreadPool::Default() {
  static CpuThreadPool* const pool = [] {
    cpu_set_t set;
    int cpus = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
    if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
    return new CpuThreadPool(
        CpuThreadsFor(std::getenv("OMP_NUM_THREADS"), cpus));
  }();
  return *pool;
}

void CpuThreadPool::RunTasks(Job* job) {
  for (int64_t t = job->next.fetch_add(1, std::memory_order_relaxed);
       t < job->num_tasks;
       t = job->next.fetch_add(1, std::memory_order_relaxed)) {
    job->fn(t);
  }
}

void CpuThreadPool::ParallelFor(int64_t num_tasks,
                                absl::FunctionRef<void(int64_t)> fn) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1 || workers_.empty() || in_job || !owner_.try_lock()) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  in_job = true;
  Job job(num_tasks, fn);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) wake_.notify_all();
  RunTasks(&job);
  {
    // From here no worker can join: only those already inside can still be
    // running a task.
    std::lock_guard<std::mutex> lock(mu_);
    job_ = nullptr;
  }
  for (int spins = 0; job.joined.load(std::memory_order_acquire) > 0; ++spins) {
    // A joined worker may have been preempted mid-task: after a short spin,
    // give it the core.
    if (spins < 2000) {
      CpuRelax();
    } else {
      sched_yield();
    }
  }
  in_job = false;
  owner_.unlock();
}

void CpuThreadPool::WorkerLoop() {
  in_job = true;
  uint64_t seen = 0;
  for (;;) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    for (int i = 1; generation_.load(std::memory_order_acquire) == seen; ++i) {
      CpuRelax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (generation_.load(std::memory_order_relaxed) == seen) {
        ++sleepers_;
        wake_.wait(lock, [&] {
          return generation_.load(std::memory_order_relaxed) != seen;
        });
        --sleepers_;
      }
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      job = job_;
      // Under mu_, so the caller cannot retire the job in between.
      if (job != nullptr) job->joined.fetch_add(1, std::memory_order_relaxed);
    }
    if (job == nullptr) continue;
    RunTasks(job);
    job->joined.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace tessera
