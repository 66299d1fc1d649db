#include "runtime/core/trace_ring.h"

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

uint64_t PointerWord(const char* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

const char* WordPointer(uint64_t w) {
  return reinterpret_cast<const char*>(static_cast<uintptr_t>(w));
}

uint64_t RoundUpToPowerOfTwo(size_t n) {
  uint64_t c = 2;
  while (c < n) c <<= 1;
  return c;
}

}  // namespace

int64_t TraceClockNs() {
  using Clock = std::chrono::steady_clock;
  static const Clock::time_point epoch = Clock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                              epoch)
      .count();
}

int32_t TraceThreadId() {
  static std::atomic<int32_t> next{1};
  thread_local const int32_t id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

TraceRing::TraceRing(size_t capacity)
    : mask_(RoundUpToPowerOfTwo(capacity) - 1),
      slots_(std::make_unique<Slot[]>(mask_ + 1)) {
  for (uint64_t i = 0; i <= mask_; ++i) {
    for (auto& w : slots_[i].words) w.store(0, std::memory_order_relaxed);
  }
}

void TraceRing::Record(const TraceEvent& e) {
  const uint64_t index = head_.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = slots_[index & mask_];
  const uint64_t writing = 2 * index + 1;
  uint64_t seen = slot.sequence.load(std::memory_order_acquire);
  // Claim the slot: only from a finished, older event (an even sequence
  // below ours). A writer still in it, or a newer index already there,
  // means this event is dropped rather than waited for.
  if ((seen & 1) != 0 || seen >= writing ||
      !slot.sequence.compare_exchange_strong(seen, writing,
                                             std::memory_order_acq_rel,
                                             std::memory_order_relaxed)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Orders the claim before the words (the seqlock's writer fence): a reader
  // that sees any new word also sees the odd sequence on its second load.
  std::atomic_thread_fence(std::memory_order_release);
  const uint64_t words[kWords] = {
      PointerWord(e.name),
      PointerWord(e.category),
      static_cast<uint64_t>(e.start_ns),
      static_cast<uint64_t>(e.duration_ns),
      (static_cast<uint64_t>(static_cast<uint32_t>(e.pid)) << 32) |
          static_cast<uint32_t>(e.tid),
      PointerWord(e.arg_name),
      static_cast<uint64_t>(e.arg)};
  for (int i = 0; i < kWords; ++i) {
    slot.words[i].store(words[i], std::memory_order_relaxed);
  }
  slot.sequence.store(writing + 1, std::memory_order_release);
}

std::vector<TraceEvent> TraceRing::Snapshot() const {
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t capacity = mask_ + 1;
  const uint64_t first = head > capacity ? head - capacity : 0;
  std::vector<TraceEvent> out;
  out.reserve(static_cast<size_t>(head - first));
  for (uint64_t index = first; index < head; ++index) {
    const Slot& slot = slots_[index & mask_];
    const uint64_t whole = 2 * index + 2;
    if (slot.sequence.load(std::memory_order_acquire) != whole) continue;
    uint64_t w[kWords];
    for (int i = 0; i < kWords; ++i) {
      w[i] = slot.words[i].load(std::memory_order_relaxed);
    }
    // The words were read between two loads of the same sequence value: no
    // writer claimed the slot in between (a claim changes it first).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.sequence.load(std::memory_order_relaxed) != whole) continue;
    TraceEvent e;
    e.name = WordPointer(w[0]);
    e.category = WordPointer(w[1]);
    e.start_ns = static_cast<int64_t>(w[2]);
    e.duration_ns = static_cast<int64_t>(w[3]);
    e.pid = static_cast<int32_t>(static_cast<uint32_t>(w[4] >> 32));
    e.tid = static_cast<int32_t>(static_cast<uint32_t>(w[4]));
    e.arg_name = WordPointer(w[5]);
    e.arg = static_cast<int64_t>(w[6]);
    out.push_back(e);
  }
  return out;
}

ScopedTrace::~ScopedTrace() {
  if (ring_ == nullptr) return;
  TraceEvent e;
  e.name = name_;
  e.category = category_;
  e.start_ns = start_ns_;
  e.duration_ns = TraceClockNs() - start_ns_;
  e.pid = pid_;
  e.tid = TraceThreadId();
  e.arg_name = arg_name_;
  e.arg = arg_;
  ring_->Record(e);
}

std::string ChromeTraceJson(const std::vector<TraceEvent>& events,
                            const std::vector<std::string>& process_names) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t pid = 0; pid < process_names.size(); ++pid) {
    list.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"args", {{"name", process_names[pid]}}}});
  }
  for (const TraceEvent& e : events) {
    nlohmann::json j = {{"name", e.name != nullptr ? e.name : "?"},
                        {"cat", e.category != nullptr ? e.category : ""},
                        {"ts", static_cast<double>(e.start_ns) / 1e3},
                        {"pid", e.pid},
                        {"tid", e.tid}};
    if (e.duration_ns > 0) {
      j["ph"] = "X";
      j["dur"] = static_cast<double>(e.duration_ns) / 1e3;
    } else {
      j["ph"] = "i";
      j["s"] = "t";
    }
    if (e.arg_name != nullptr) j["args"] = {{e.arg_name, e.arg}};
    list.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", std::move(list)},
                        {"displayTimeUnit", "ms"}}
      .dump();
}

absl::Status WriteChromeTrace(const std::string& path,
                              const std::vector<TraceEvent>& events,
                              const std::vector<std::string>& process_names) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace: cannot write ", path));
  }
  file << ChromeTraceJson(events, process_names) << "\n";
  file.close();
  if (!file) {
    return absl::DataLossError(
        absl::StrCat("--trace: writing ", path, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
