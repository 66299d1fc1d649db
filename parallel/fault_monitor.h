// FaultMonitor: failure detection for an MPI job — a per-step deadline on
// every control-plane and MPI-collective wait, a fault round that names the
// rank that stopped answering, and a watchdog thread for steps stuck outside
// MPI.
//
// Why: a blocking MPI call waits forever for a peer that is stopped
// (SIGSTOP, a hung device, a swapped-out node), and Open MPI spins while it
// waits, so a stalled rank used to hang the whole job at 100% CPU. Here every
// wait of the control channel and of MpiCommunicator is a polled wait
// (nonblocking call + MPI_Test / MPI_Improbe) through WaitRequest/WaitProbe:
//   - while a step is armed (BeginStep..EndStep), a wait that is still open
//     at the step's deadline returns DeadlineExceeded (RankLocal), naming
//     what it waited for;
//   - every polled wait, armed or not, answers the fault round below, so a
//     rank that is alive is never mistaken for the stalled one.
// The step's limit is max(step_timeout, 4 × the longest step this rank has
// run, 4 × the step's tokens × the most seconds per token a step has taken),
// so a limit that fits decode also fits the longer prefill chunks seen since,
// and a prefill chunk larger than any before gets a limit in proportion to
// its tokens; the first step gets 10 × step_timeout (NCCL connects lazily on
// first use, kernels autotune; a first step that can take longer, a large
// model's first prefill chunk on CPUs, needs a larger --step-timeout);
// step_timeout 0 turns deadlines (startup's too, below) and the watchdog off.
//
// The fault round (EndJobAfterFault; RunJob calls it for such a status):
//   rank 0 asks every rank that has not reported yet (on the monitor's own
//   duplicate of MPI_COMM_WORLD), waits up to `grace` for the answers, prints
//   ONE line naming each rank that did not answer —
//     tessera: rank 1 (host h, tp 1, stage 0) stopped responding: ...
//   — and ends the job with MPI_Abort (exit code 1 on every rank). A rank
//   other than 0 reports to rank 0 and waits to be ended; if rank 0 does not
//   end the job within 2 × grace + 1 s (+ 0.25 s × (rank − 1), at most 2 s),
//   rank 0 is the one that is gone: this rank tells the other workers
//   (kRank0GoneTag; a worker told so stays silent), prints the line naming
//   rank 0 and aborts itself. So one line names rank 0, usually rank 1's.
// The watchdog thread only looks at the clock: a step that has run half its
// limit marks the monitor stalled (rank 0's /health then answers 503 until
// the step ends, if it does); one still running grace + 5 s past the limit is
// stuck outside MPI (a kernel, a device sync), and the watchdog prints the line
// and _Exits (it may not call MPI: MPI_THREAD_FUNNELED), which makes the
// launcher end the job. Before either exit (MPI_Abort, _Exit) the process's
// fatal hook runs (runtime/core/fatal_hook.h): a server that is still
// serving ends every open response with the error first.
//
// Between steps a worker's wait for the next plan has the same limit: an
// idle rank 0 sends a HEARTBEAT plan every quarter of the step timeout
// (Coordinator::Idle, from the server's idle loop), so a silent rank 0 is a
// stalled one.
//
// Startup (BeginStartup..EndStartup; RunJob arms it on every rank once the
// monitor is installed): the manifest broadcast, the grid's communicators,
// NCCL setup, the weights (sent by rank 0, received, or read by each rank),
// the KV block agreement, the placement gather and, on a worker, the wait for
// the first plan. A legitimately slow load (a 140 GB checkpoint on a slow
// disk, rank 0 reading a big tensor between sends) has no fixed length, so
// the deadline is progress-based: a startup wait is ended when no rank has
// made progress for startup_timeout (--startup-timeout, default 60 s).
// Progress is a phase boundary (BeginStartup), a weight chunk sent or
// received, or a tensor of the weights stored (Progress); each
// restarts this rank's limit, and at most every quarter of the limit also
// sends every other rank a beacon (kProgressTag) that restarts theirs. So the
// rule is: the longest a rank may go without progress (one tensor read from
// disk, one 64 MiB chunk sent) must stay below the limit; a wait for a
// stopped peer ends startup_timeout after the last progress anywhere in the
// job, and the fault round then names the peer. Progress also answers a fault
// round (a rank reading weights is not in a wait), so a loading rank is not
// taken for the stalled one. Blocking collectives of startup are polled waits
// too (MPI_Iallreduce, MPI_Igather, MPI_Ibcast) or follow a polled barrier
// (MPI_Comm_split, ncclCommInitRank), and the watchdog covers the rest as for
// a step (limit + grace + 5 s without progress). On rank 0 the startup phase
// ends when the coordinator is built; what its command does before the
// first plan (a server's start, reading and tokenizing prompts) has no
// deadline of its own, but it must fit in the workers' limit for that plan
// (a server's idle loop sends HEARTBEATs from its start).
//
// Before the monitor exists (MPI_Init, whose fence waits for every rank, and
// the communicator duplications of ControlChannel::Create and
// FaultMonitor::Create) nothing can be polled: a StartupGuard (below) ends
// this rank when the monitor is not installed within max(startup limit,
// 10 s) (launch/tessera.cc; MPI_Init shows no progress and takes seconds on
// a loaded machine).
//
// Limits: a worker that stalls while the server is idle is found at the next
// step (nothing waits on it before); a rank stopped before its monitor exists
// is not named (every other rank names itself as waiting, and exits). A
// killed rank is the launcher's to notice (Open MPI ends the job within
// about a second and names the rank).
//
// One monitor per process (Install/Get), used from the MPI thread, except
// stalled(), which any thread may read.
#ifndef TESSERA_PARALLEL_FAULT_MONITOR_H_
#define TESSERA_PARALLEL_FAULT_MONITOR_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/mpi_world.h"

namespace tessera {

struct FaultMonitorOptions {
  // Seconds a step may take before the job is ended (at least; see the
  // header). 0: no deadline and no watchdog.
  double step_timeout_seconds = 6.0;
  // Seconds a starting job may go without progress anywhere (see the
  // header) before its waits end. 0 (or step_timeout_seconds 0): none.
  double startup_timeout_seconds = 60.0;
  // How long rank 0 waits for the other ranks' answers in a fault round.
  double grace_seconds = 2.0;
  // The grid, for naming ranks (tp rank = r % tp, stage = r / tp).
  int tp = 1;
};

// Waits for `request` (a nonblocking MPI call's) to complete; *status gets
// its status when non-null. With no monitor installed: MPI_Wait. Otherwise
// polls, and returns DeadlineExceeded at an armed step's deadline or Aborted
// when a fault round is under way; both RankLocal, and `what` ("receiving
// ... from rank 1") names the wait. Internal for an MPI error.
absl::Status WaitRequest(MPI_Request* request, MPI_Status* status,
                         absl::FunctionRef<std::string()> what);

// MPI_Mprobe as a polled wait (MPI_Improbe), with WaitRequest's errors.
absl::Status WaitProbe(int source, int tag, MPI_Comm comm, MPI_Message* message,
                       MPI_Status* status,
                       absl::FunctionRef<std::string()> what);

// MPI_Barrier as a polled wait (MPI_Ibarrier), with WaitRequest's errors:
// put before a blocking collective that has no nonblocking form
// (MPI_Comm_split, ncclCommInitRank), so a rank that never arrives is found
// here rather than inside it.
absl::Status PolledBarrier(MPI_Comm comm,
                           absl::FunctionRef<std::string()> what);

// The installed monitor's BeginStartup / Progress (no-ops without one).
void StartupPhase(std::string phase);
void StartupProgress();

// Whether `status` is a fault that EndJobAfterFault must end (a wait's
// deadline or a fault round).
bool IsStallFault(const absl::Status& status);

// Covers what comes before the monitor: from construction until a monitor is
// installed (FaultMonitor::Install), a thread waits up to `seconds`; past
// that it prints "tessera: rank R (host H) did not finish starting MPI within
// S s (--startup-timeout): ..." and _Exits(1), which makes the launcher end
// the job (a peer stopped in MPI_Init holds every rank there). R is the
// launcher's rank variable (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID).
// seconds <= 0: does nothing. One at a time per process.
class StartupGuard {
 public:
  explicit StartupGuard(double seconds);
  ~StartupGuard();  // Disarms it, and joins the thread.
  StartupGuard(const StartupGuard&) = delete;
  StartupGuard& operator=(const StartupGuard&) = delete;
  // Called by FaultMonitor::Install.
  void Disarm();

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool armed_ = true;
  std::thread thread_;
};

class FaultMonitor {
 public:
  // Collective over the world (it duplicates MPI_COMM_WORLD and gathers every
  // rank's host name). Call once, on every rank, before Install.
  static absl::StatusOr<std::unique_ptr<FaultMonitor>> Create(
      const MpiWorld& world, FaultMonitorOptions options);
  ~FaultMonitor();

  // The process's monitor for WaitRequest/WaitProbe (null: none). Install
  // nullptr before the monitor dies.
  static void Install(FaultMonitor* monitor);
  static FaultMonitor* Get();

  // Arms / disarms the deadline of step `step` on this rank; `tokens`: the
  // tokens the step computes (its plan's), which scale its limit.
  void BeginStep(int64_t step, int64_t tokens = 0);
  void EndStep();
  // Arms the same deadline for a worker's wait for the plan of step `step`
  // (its length does not count as a step's for the adaptive limit).
  void BeginWaitForPlan(int64_t step);
  // Arms (or, at a phase boundary, restarts) the startup deadline (see the
  // header); `phase` ("receiving weights") names it in the fault line. Also
  // counts as progress.
  void BeginStartup(std::string phase);
  // Progress during startup: restarts this rank's startup limit, sends the
  // other ranks a beacon when one is due, and answers a fault round. A fault
  // (a round under way) ends the job here (EndJobAfterFault), since the
  // callers (weight loading callbacks) cannot return it. No-op when no
  // startup deadline is armed.
  void Progress();
  // Disarms the startup deadline (EndStep does too).
  void EndStartup() { EndStep(); }
  // How often an idle rank 0 sends a HEARTBEAT plan: a quarter of the step
  // timeout (0: never).
  double heartbeat_interval_seconds() const {
    return options_.step_timeout_seconds / 4;
  }

  // The limit of the step armed last, in seconds (0 before any).
  double limit_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_seconds_;
  }

  // Any thread: the step under way has run half its limit or more (or a
  // fault round began): the engine cannot make progress.
  bool stalled() const { return stalled_.load(std::memory_order_acquire); }

  // "rank 1 (host h, tp 1, stage 0)".
  std::string Name(int rank) const;

  // Ends the job after `fault` (IsStallFault) as the header says.
  [[noreturn]] void EndJobAfterFault(const absl::Status& fault);

  // One poll of the fault channel (WaitRequest/WaitProbe call it between
  // MPI_Tests): OK, or the fault that ends the wait.
  absl::Status Check(absl::FunctionRef<std::string()> what);

  // The message tags on the monitor's communicator.
  static constexpr int kQueryTag = 1;      // Rank 0 → rank: are you alive?
  static constexpr int kReportTag = 2;     // Rank → rank 0: alive, and why.
  static constexpr int kProgressTag = 3;   // Rank → rank: startup progress.
  static constexpr int kRank0GoneTag = 4;  // Worker → workers: I name rank 0.

 private:
  using Clock = std::chrono::steady_clock;
  FaultMonitor(const MpiWorld& world, MpiComm comm, FaultMonitorOptions options)
      : world_(world), comm_(std::move(comm)), options_(options) {}
  void Watch();
  // Restarts the armed startup deadline from `now`; mu_ held.
  void RestartStartupLocked(Clock::time_point now);
  // Sends the progress beacons when due (MPI thread).
  void SendBeacons(Clock::time_point now);
  [[noreturn]] void Abort(const std::string& line);

  const MpiWorld& world_;
  MpiComm comm_;
  FaultMonitorOptions options_;
  std::vector<std::string> hosts_;
  std::atomic<bool> stalled_{false};

  // The armed step; guarded by mu_ (the watchdog reads it).
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool armed_ = false;
  bool counts_ = false;   // The armed deadline is a step's (not a plan wait).
  bool startup_ = false;  // The armed deadline is startup's (progress-based).
  std::string phase_;     // Startup's phase, while startup_.
  bool stopping_ = false;
  int64_t step_ = -1;
  Clock::time_point step_start_;
  Clock::time_point deadline_;
  double limit_seconds_ = 0.0;
  double longest_step_seconds_ = 0.0;
  double most_seconds_per_token_ = 0.0;  // Over counted steps with tokens.
  int64_t step_tokens_ = 0;
  int64_t steps_done_ = 0;
  Clock::time_point next_check_;
  // Progress beacons (MPI thread): one outstanding send per peer at most.
  std::vector<MPI_Request> beacons_;
  Clock::time_point next_beacon_;
  std::thread watchdog_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_FAULT_MONITOR_H_
