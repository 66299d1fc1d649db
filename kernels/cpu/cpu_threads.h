// The CPU backend's threads: one fork-join pool that runs the parallel loops
// of every op (attention across (token, head) pairs, large matrix products
// across output features).
//
// Why not OpenMP: libgomp's workers busy-wait for about 300,000 spins after
// every parallel region, and a region ends only when every thread of its team
// has arrived, even one the OS has not scheduled yet. On a 2-vCPU machine that
// is shared (or that also runs OpenBLAS's own pool, which busy-waits too) the
// spinning threads take the cores the work needs: a tiny-Qwen3 decode step at a
// 1000-token context took 30 ms instead of 3. Its wait policy can only be set
// by environment variables read before main(). This pool spins briefly, then
// sleeps, and a job never waits for a worker that has not joined it: the
// caller runs whatever tasks are left itself.
#ifndef TESSERA_KERNELS_CPU_CPU_THREADS_H_
#define TESSERA_KERNELS_CPU_CPU_THREADS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tessera {

// Threads the default pool uses: the first value of OMP_NUM_THREADS
// (`omp_num_threads`, e.g. "4" or "4,2"; null or not a positive number:
// ignored), else `cpus`. At least 1, at most 1024.
int CpuThreadsFor(const char* omp_num_threads, int cpus);

class CpuThreadPool {
 public:
  // `threads` (clamped to [1, 1024]) counts the calling thread: the pool
  // starts threads - 1 workers.
  explicit CpuThreadPool(int threads);
  ~CpuThreadPool();
  CpuThreadPool(const CpuThreadPool&) = delete;
  CpuThreadPool& operator=(const CpuThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) exactly once for every task in [0, num_tasks), handed out
  // one at a time in order to the calling thread and the workers that are
  // free; returns when all have run (their writes visible to the caller). A
  // call made while the pool runs another job (from another thread, or from
  // inside fn) runs its tasks on its own thread, in order.
  void ParallelFor(int64_t num_tasks, absl::FunctionRef<void(int64_t)> fn);

  // The process-wide pool: CpuThreadsFor(getenv("OMP_NUM_THREADS"), CPUs this
  // process may run on), made on first use and never destroyed.
  static CpuThreadPool& Default();

 private:
  struct Job;
  void WorkerLoop();
  static void RunTasks(Job* job);

  std::mutex owner_;  // Held by the caller whose job is running.
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // Bumped per job (and at shutdown).
  Job* job_ = nullptr;                   // Guarded by mu_.
  int sleepers_ = 0;                     // Guarded by mu_.
  bool stop_ = false;                    // Guarded by mu_.
  std::vector<std::thread> workers_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CPU_CPU_THREADS_H_
