// A fixed-size ring of timed events that many threads write at once and any
// thread can snapshot, for `--trace FILE` (a Chrome trace that Perfetto
// opens: steps, their phases, each rank's forward).
//
// Why by hand: the tracers packaged for Debian (lttng, perfetto's SDK is not
// packaged) are system-wide or need a daemon; what a step loop needs is a
// lock-free append of a few words, bounded memory, and a snapshot that never
// shows a torn event. That is a seqlock per slot, written here.
//
// Contract:
//  - Record() never blocks and never allocates: it claims the next index with
//    one atomic add, then the slot (index mod capacity) with a compare-and-
//    swap on the slot's sequence word. Once the ring has wrapped, a slot holds
//    the newest event written to it; an older writer that finds its slot taken
//    by a newer index, or another writer still in it, drops its event
//    (counted: dropped()).
//  - Snapshot() returns the last `capacity` indices' events that are whole,
//    oldest first: each is the event exactly as one Record wrote it (read
//    between two equal sequence values), never a mix. Events being written
//    during the snapshot, or overwritten during it, are left out.
//  - Every shared word is a std::atomic, so the ring is data-race free (and
//    clean under ThreadSanitizer).
//  - Names, categories and argument names are `const char*` of static storage
//    duration (string literals): the ring keeps the pointer only.
#ifndef TESSERA_RUNTIME_CORE_TRACE_RING_H_
#define TESSERA_RUNTIME_CORE_TRACE_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tessera {

// The events `--trace` keeps per process (2^18: about 16 MiB, tens of
// thousands of steps).
inline constexpr size_t kTraceEvents = size_t{1} << 18;

struct TraceEvent {
  const char* name = nullptr;      // Static storage.
  const char* category = nullptr;  // Static storage.
  int64_t start_ns = 0;            // TraceClockNs() at the start.
  int64_t duration_ns = 0;         // 0: an instant.
  int32_t pid = 0;                 // The rank.
  int32_t tid = 0;                 // A small per-thread id (TraceThreadId).
  const char* arg_name = nullptr;  // Static storage, or null: no argument.
  int64_t arg = 0;
};

// Nanoseconds of a steady clock since this process's first call.
int64_t TraceClockNs();
// A small id for the calling thread, stable for its lifetime (1, 2, ...).
int32_t TraceThreadId();

class TraceRing {
 public:
  // capacity: rounded up to a power of two, at least 2.
  explicit TraceRing(size_t capacity);
  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;

  void Record(const TraceEvent& event);
  std::vector<TraceEvent> Snapshot() const;

  size_t capacity() const { return mask_ + 1; }
  // Indices claimed so far (written or dropped).
  uint64_t recorded() const { return head_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kWords = 7;
  struct Slot {
    // 2 i + 1 while index i is written, 2 i + 2 once it is whole, 0 never
    // written.
    std::atomic<uint64_t> sequence{0};
    std::atomic<uint64_t> words[kWords];
  };

  uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> dropped_{0};
};

// Records a complete event from construction to destruction (nothing when
// ring is null).
class ScopedTrace {
 public:
  ScopedTrace(TraceRing* ring, const char* name, const char* category,
              int32_t pid, const char* arg_name = nullptr, int64_t arg = 0)
      : ring_(ring),
        name_(name),
        category_(category),
        pid_(pid),
        arg_name_(arg_name),
        arg_(arg),
        start_ns_(ring != nullptr ? TraceClockNs() : 0) {}
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;
  ~ScopedTrace();

 private:
  TraceRing* ring_;
  const char* name_;
  const char* category_;
  int32_t pid_;
  const char* arg_name_;
  int64_t arg_;
  int64_t start_ns_;
};

// The events as a Chrome trace (the JSON object format: {"traceEvents": [...]},
// complete "X" events and instant "i" events, microsecond timestamps;
// Perfetto and chrome://tracing open it). `process_names` names the pids
// (index = pid; e.g. "rank 0").
std::string ChromeTraceJson(const std::vector<TraceEvent>& events,
                            const std::vector<std::string>& process_names);

// Writes ChromeTraceJson to `path` (replacing it); an error names the file.
absl::Status WriteChromeTrace(const std::string& path,
                              const std::vector<TraceEvent>& events,
                              const std::vector<std::string>& process_names);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_TRACE_RING_H_
