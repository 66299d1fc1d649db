#include "parallel/fault_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/core/fatal_hook.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

constexpr char kStallPayload[] = "tessera.dev/stall-fault";

// A RankLocal status that EndJobAfterFault must end (IsStallFault).
absl::Status StallFault(absl::Status status) {
  status.SetPayload(kStallPayload, absl::Cord("1"));
  return RankLocal(std::move(status));
}

// Read by HTTP threads (Coordinator::making_progress), hence atomic.
std::atomic<FaultMonitor*> g_monitor{nullptr};
// The StartupGuard that Install disarms.
std::atomic<StartupGuard*> g_startup_guard{nullptr};

std::string Seconds(double s) { return absl::StrFormat("%.1f s", s); }

// One write of the whole line, so lines of dying ranks do not interleave.
void WriteLine(const std::string& text) {
  const std::string line = absl::StrCat("tessera: ", text, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

bool IsStallFault(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kStallPayload).has_value();
}

absl::Status WaitRequest(MPI_Request* request, MPI_Status* status,
                         absl::FunctionRef<std::string()> what) {
  MPI_Status* out = status != nullptr ? status : MPI_STATUS_IGNORE;
  FaultMonitor* monitor = FaultMonitor::Get();
  if (monitor == nullptr) {
    const int rc = MPI_Wait(request, out);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Wait", what());
    return absl::OkStatus();
  }
  while (true) {
    int done = 0;
    const int rc = MPI_Test(request, &done, out);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Test", what());
    if (done) return absl::OkStatus();
    RETURN_IF_ERROR(monitor->Check(what));
  }
}

absl::Status WaitProbe(int source, int tag, MPI_Comm comm, MPI_Message* message,
                       MPI_Status* status,
                       absl::FunctionRef<std::string()> what) {
  FaultMonitor* monitor = FaultMonitor::Get();
  if (monitor == nullptr) {
    const int rc = MPI_Mprobe(source, tag, comm, message, status);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Mprobe", what());
    return absl::OkStatus();
  }
  while (true) {
    int found = 0;
    const int rc = MPI_Improbe(source, tag, comm, &found, message, status);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Improbe", what());
    if (found) return absl::OkStatus();
    RETURN_IF_ERROR(monitor->Check(what));
  }
}

void StartupPhase(std::string phase) {
  if (FaultMonitor* monitor = FaultMonitor::Get()) {
    monitor->BeginStartup(std::move(phase));
  }
}

void StartupProgress() {
  if (FaultMonitor* monitor = FaultMonitor::Get()) monitor->Progress();
}

absl::Status PolledBarrier(MPI_Comm comm,
                           absl::FunctionRef<std::string()> what) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Ibarrier(comm, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibarrier", what());
  return WaitRequest(&request, nullptr, what);
}

absl::StatusOr<std::unique_ptr<FaultMonitor>> FaultMonitor::Create(
    const MpiWorld& world, FaultMonitorOptions options) {
  if (!(options.step_timeout_seconds >= 0) ||
      !(options.startup_timeout_seconds >= 0) || !(options.grace_seconds > 0) ||
      options.tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault monitor: step timeout ", options.step_timeout_seconds,
        " s and startup timeout ", options.startup_timeout_seconds,
        " s must be >= 0, grace ", options.grace_seconds, " s > 0 and tp ",
        options.tp, " >= 1"));
  }
  ASSIGN_OR_RETURN(MpiComm comm, MpiComm::Dup(world.comm(), "fault(world)"));
  std::unique_ptr<FaultMonitor> m(
      new FaultMonitor(world, std::move(comm), options));
  // Every rank's host, so that any rank can name any other in its line.
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0');
  world.host_name().copy(mine.data(), mine.size() - 1);
  std::vector<char> all(mine.size() * world.size());
  const int rc = MPI_Allgather(
      mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
      static_cast<int>(mine.size()), MPI_CHAR, m->comm_.get());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Allgather", "gathering every rank's host name");
  }
  for (int r = 0; r < world.size(); ++r) {
    const char* h = all.data() + r * mine.size();
    m->hosts_.emplace_back(h, strnlen(h, mine.size()));
  }
  m->beacons_.assign(world.size(), MPI_REQUEST_NULL);
  if (options.step_timeout_seconds > 0) {  // Startup's needs it too.
    m->watchdog_ = std::thread([p = m.get()] { p->Watch(); });
  }
  return m;
}

FaultMonitor::~FaultMonitor() {
  FaultMonitor* self = this;
  g_monitor.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // A beacon to a peer that never received it (it ended first) must not
  // outlive the communicator.
  for (MPI_Request& r : beacons_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
}

void FaultMonitor::Install(FaultMonitor* monitor) {
  g_monitor.store(monitor);
  if (monitor == nullptr) return;
  if (StartupGuard* guard = g_startup_guard.load()) guard->Disarm();
}

StartupGuard::StartupGuard(double seconds) {
  if (!(seconds > 0)) {
    armed_ = false;
    return;
  }
  g_startup_guard.store(this);
  thread_ = std::thread([this, seconds] {
    std::unique_lock<std::mutex> lock(mu_);
    const bool disarmed =
        wake_.wait_for(lock, std::chrono::duration<double>(seconds),
                       [this] { return !armed_; });
    if (disarmed) return;
    // Before MPI_Init returns the rank is the launcher's variable.
    const char* rank = nullptr;
    for (const char* name :
         {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
      rank = std::getenv(name);
      if (rank != nullptr) break;
    }
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    WriteLine(absl::StrCat(
        "rank ", rank != nullptr ? rank : "?", " (host ", host,
        ") did not finish starting MPI within ", Seconds(seconds),
        " (--startup-timeout): a rank of the job never started, or is stopped "
        "or unreachable; exiting"));
    std::_Exit(1);
  });
}

StartupGuard::~StartupGuard() {
  Disarm();
  if (thread_.joinable()) thread_.join();
  StartupGuard* self = this;
  g_startup_guard.compare_exchange_strong(self, nullptr);
}

void StartupGuard::Disarm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }
  wake_.notify_all();
}
FaultMonitor* FaultMonitor::Get() { return g_monitor.load(); }

std::string FaultMonitor::Name(int rank) const {
  const std::string host =
      rank >= 0 && rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : "?";
  return absl::StrCat("rank ", rank, " (host ", host, ", tp ",
                      rank % options_.tp, ", stage ", rank / options_.tp, ")");
}

void FaultMonitor::RestartStartupLocked(Clock::time_point now) {
  stalled_.store(false, std::memory_order_release);
  step_start_ = now;
  deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(limit_seconds_));
}

void FaultMonitor::SendBeacons(Clock::time_point now) {
  if (now < next_beacon_) return;
  next_beacon_ =
      now +
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(options_.startup_timeout_seconds / 4));
  static const int kBeacon = 1;
  for (int r = 0; r < world_.size(); ++r) {
    if (r == world_.rank()) continue;
    MPI_Request& request = beacons_[r];
    if (request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      // A peer that has not taken the last one (stopped, or busy): one
      // outstanding beacon is enough.
      if (!done) continue;
    }
    MPI_Isend(&kBeacon, 1, MPI_INT, r, kProgressTag, comm_.get(), &request);
  }
}

void FaultMonitor::BeginStartup(std::string phase) {
  if (options_.step_timeout_seconds <= 0 ||
      options_.startup_timeout_seconds <= 0) {
    return;
  }
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    counts_ = false;
    startup_ = true;
    phase_ = std::move(phase);
    step_ = -1;
    step_tokens_ = 0;
    limit_seconds_ = options_.startup_timeout_seconds;
    RestartStartupLocked(now);
  }
  SendBeacons(now);
}

void FaultMonitor::Progress() {
  if (!startup_) return;  // Written only by this (the MPI) thread.
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    RestartStartupLocked(now);
  }
  SendBeacons(now);
  // phase_ is written only by this thread.
  const absl::Status fault = Check([&] { return phase_; });
  if (IsStallFault(fault)) EndJobAfterFault(fault);
}

void FaultMonitor::BeginWaitForPlan(int64_t step) {
  BeginStep(step, /*tokens=*/0);
  std::lock_guard<std::mutex> lock(mu_);
  counts_ = false;
}

void FaultMonitor::BeginStep(int64_t step, int64_t tokens) {
  if (options_.step_timeout_seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  counts_ = true;
  startup_ = false;
  step_ = step;
  step_tokens_ = tokens;
  step_start_ = Clock::now();
  // The first step may set up what later steps reuse (NCCL connects lazily
  // on first use, kernels autotune), so it gets ten times the limit.
  limit_seconds_ =
      steps_done_ == 0
          ? 10.0 * options_.step_timeout_seconds
          : std::max({options_.step_timeout_seconds,
                      4.0 * longest_step_seconds_,
                      4.0 * most_seconds_per_token_ *
                          static_cast<double>(std::max<int64_t>(tokens, 0))});
  deadline_ = step_start_ + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(limit_seconds_));
}

void FaultMonitor::EndStep() {
  if (options_.step_timeout_seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;
  armed_ = false;
  startup_ = false;
  stalled_.store(false, std::memory_order_release);  // It finished after all.
  if (!counts_) return;
  ++steps_done_;
  const double seconds =
      std::chrono::duration<double>(Clock::now() - step_start_).count();
  longest_step_seconds_ = std::max(longest_step_seconds_, seconds);
  if (step_tokens_ > 0) {
    most_seconds_per_token_ = std::max(
        most_seconds_per_token_, seconds / static_cast<double>(step_tokens_));
  }
}

absl::Status FaultMonitor::Check(absl::FunctionRef<std::string()> what) {
  const Clock::time_point now = Clock::now();
  // MPI_Test keeps the wait responsive; the fault channel is probed about
  // once a millisecond, which costs nothing next to a step.
  if (now < next_check_) return absl::OkStatus();
  next_check_ = now + std::chrono::milliseconds(1);
  // armed_, startup_ and deadline_ are written only by this (the MPI)
  // thread.
  if (armed_ && now >= deadline_) {
    if (startup_) {
      return StallFault(absl::DeadlineExceededError(absl::StrCat(
          "startup (", phase_, ") made no progress on any rank for ",
          Seconds(limit_seconds_), " (--startup-timeout) while ",
          Name(world_.rank()), " was in ", what())));
    }
    const std::string doing =
        counts_ ? absl::StrCat("step ", step_)
                : absl::StrCat("the wait for step ", step_, "'s plan");
    const std::string tokens =
        step_tokens_ > 0 ? absl::StrCat(" (", step_tokens_, " tokens)") : "";
    return StallFault(absl::DeadlineExceededError(absl::StrCat(
        doing, " ran past its limit of ", Seconds(limit_seconds_), tokens,
        " while ", Name(world_.rank()), " was in ", what())));
  }
  const bool coordinator = world_.rank() == 0;
  int found = 0;
  MPI_Status status;
  while (true) {
    const int rc =
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_.get(), &found, &status);
    if (rc != MPI_SUCCESS) {
      return MpiError(rc, "MPI_Iprobe", "polling the fault channel");
    }
    if (!found) return absl::OkStatus();
    if (status.MPI_TAG != kProgressTag) break;
    // A peer made progress: so does the job, and a startup wait goes on.
    int beacon = 0;
    MPI_Recv(&beacon, 1, MPI_INT, status.MPI_SOURCE, kProgressTag, comm_.get(),
             MPI_STATUS_IGNORE);
    if (startup_) {
      std::lock_guard<std::mutex> lock(mu_);
      RestartStartupLocked(now);
    }
  }
  // During startup the line says which phase this rank was in.
  const std::string during =
      startup_ ? absl::StrCat(" during startup (", phase_, ")") : "";
  if (coordinator) {
    return StallFault(absl::AbortedError(
        absl::StrCat(Name(status.MPI_SOURCE), " reported a fault while ",
                     Name(0), " was in ", what(), during)));
  }
  return StallFault(absl::AbortedError(
      absl::StrCat("rank 0 began a fault round while ", Name(world_.rank()),
                   " was in ", what(), during)));
}

void FaultMonitor::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_ || !armed_) continue;
    const Clock::time_point now = Clock::now();
    // Half the limit without progress: /health answers 503 from here on (a
    // balancer stops sending work), while the fault round has not begun.
    if (now >= step_start_ + (deadline_ - step_start_) / 2) {
      stalled_.store(true, std::memory_order_release);
    }
    if (now < deadline_) continue;
    const double over = std::chrono::duration<double>(now - deadline_).count();
    if (over < options_.grace_seconds + 5.0) continue;
    // The MPI thread never reached a polled wait: it is stuck in a
    // computation or a device call. Only the launcher can end the job now
    // (MPI_Abort is the MPI thread's), and a non-zero exit makes it do so.
    const std::string doing =
        startup_ ? absl::StrCat("startup (", phase_, ") made no progress for ")
                 : absl::StrCat("step ", step_, " has run ");
    const std::string line = absl::StrCat(
        Name(world_.rank()), " is stuck: ", doing,
        Seconds(std::chrono::duration<double>(now - step_start_).count()),
        ", past its limit of ", Seconds(limit_seconds_),
        ", outside any MPI wait (a computation or device call that does not "
        "return); exiting");
    WriteLine(line);
    RunFatalHook(line);  // A server tells its clients first.
    std::_Exit(1);
  }
}

void FaultMonitor::Abort(const std::string& line) {
  WriteLine(line);
  RunFatalHook(line);  // A server still serving tells its clients first.
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void FaultMonitor::EndJobAfterFault(const absl::Status& fault) {
  stalled_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;  // The watchdog leaves the round to this thread.
  }
  const int me = world_.rank();
  const int size = world_.size();
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.grace_seconds));
  if (me != 0) {
    // Tell rank 0 this rank is alive and why it stopped; rank 0 ends the job.
    const std::string text(fault.message());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0,
              kReportTag, comm_.get(), &request);
    // Ranks wait a little longer the higher they are, and the first to give
    // up on rank 0 tells the other workers (kRank0GoneTag), so that when rank
    // 0 is the one gone one line (usually rank 1's) names it.
    const double wait_seconds =
        2 * options_.grace_seconds + 1 + std::min(2.0, 0.25 * (me - 1));
    const Clock::time_point give_up =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(wait_seconds));
    bool named = false;  // Another worker has named rank 0.
    while (!named && Clock::now() < give_up) {
      int done = 0;
      if (request != MPI_REQUEST_NULL) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      }
      int found = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, kRank0GoneTag, comm_.get(), &found,
                 MPI_STATUS_IGNORE);
      named = found != 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (named) {
      // Its abort is ending the job; abort quietly if that takes long.
      std::this_thread::sleep_for(grace);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }
    static const int kGone = 1;
    for (int r = 1; r < size; ++r) {
      if (r == me) continue;
      MPI_Request told = MPI_REQUEST_NULL;
      MPI_Isend(&kGone, 1, MPI_INT, r, kRank0GoneTag, comm_.get(), &told);
      MPI_Request_free(&told);
    }
    Abort(absl::StrCat(Name(0), " stopped responding: it did not end the job ",
                       Seconds(wait_seconds), " after ", Name(me),
                       " reported: ", fault.message()));
  }

  // Rank 0: ask every rank; whoever does not answer within the grace period
  // is the one that stalled (or vanished).
  std::vector<bool> answered(size, false);
  answered[0] = true;
  std::vector<std::string> reports(size);
  const int query = 1;
  std::vector<MPI_Request> queries(size, MPI_REQUEST_NULL);
  for (int r = 1; r < size; ++r) {
    MPI_Isend(&query, 1, MPI_INT, r, kQueryTag, comm_.get(), &queries[r]);
  }
  const Clock::time_point give_up = Clock::now() + grace;
  int missing = size - 1;
  while (missing > 0 && Clock::now() < give_up) {
    int found = 0;
    MPI_Status status;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Improbe(MPI_ANY_SOURCE, kReportTag, comm_.get(), &found, &message,
                &status);
    if (!found) {
      int ignored = 0;
      MPI_Testall(size, queries.data(), &ignored, MPI_STATUSES_IGNORE);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    int count = 0;
    MPI_Get_count(&status, MPI_CHAR, &count);
    std::string text(std::max(count, 0), '\0');
    MPI_Mrecv(text.data(), count, MPI_CHAR, &message, MPI_STATUS_IGNORE);
    const int from = status.MPI_SOURCE;
    if (from > 0 && from < size && !answered[from]) {
      answered[from] = true;
      reports[from] = std::move(text);
      --missing;
    }
  }
  std::vector<std::string> silent;
  for (int r = 1; r < size; ++r) {
    if (!answered[r]) silent.push_back(Name(r));
  }
  if (!silent.empty()) {
    Abort(absl::StrCat(absl::StrJoin(silent, ", "), " stopped responding (",
                       silent.size() == 1 ? "no answer" : "no answers",
                       " within ", Seconds(options_.grace_seconds),
                       "): ", fault.message()));
  }
  // Every rank is alive: a wait that cannot complete (a deadlock, or steps
  // slower than the limit). Say what each rank was doing.
  std::vector<std::string> doing;
  for (int r = 1; r < size; ++r) {
    if (!reports[r].empty()) doing.push_back(reports[r]);
  }
  Abort(absl::StrCat(Name(0), ": every rank answered, but ", fault.message(),
                     doing.empty() ? "" : "; ", absl::StrJoin(doing, "; ")));
}

}  // namespace tessera
