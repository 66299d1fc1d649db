// OpTimer: the device time of each op, summed per label (tessera bench
// --profile-ops). Ops (kernels/ops.h) brackets every op that does device work
// with Begin/End while a timer is set; Collect turns what was recorded into
// totals.
//
// What the times mean: each backend measures an op from just before its work
// to just after it on the op's own stream (CUDA events; the wall clock where
// ops run on the calling thread, the CPU). Markers between kernels keep them
// from overlapping, so a total is the op's own time without overlap, in an
// eager step (a replayed graph records nothing).
#ifndef TESSERA_KERNELS_OP_TIMER_H_
#define TESSERA_KERNELS_OP_TIMER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tessera {

// One label's share of a Collect: how many ops carried it and their summed
// time in microseconds.
struct OpTimeTotal {
  std::string label;
  int64_t calls = 0;
  double total_us = 0.0;
};

class OpTimer {
 public:
  virtual ~OpTimer();

  // Bracket one op's device work, in order and never nested (Ops calls them;
  // End names what ran since Begin). They never fail the op: an error (a
  // marker that could not be recorded) is kept and returned by the next
  // Collect.
  virtual void Begin() = 0;
  virtual void End(std::string label) = 0;

  // Waits for the device, resolves every Begin/End pair since the last
  // Collect into totals per label, sorted by total_us (largest first; ties by
  // label), and starts over. The first error kept since the last Collect is
  // returned instead (what was recorded is dropped either way).
  virtual absl::StatusOr<std::vector<OpTimeTotal>> Collect() = 0;
};

// Sums times per label and hands them out sorted (OpTimer::Collect's order).
class OpTimeSums {
 public:
  void Add(std::string label, double us);
  // Merges another sum of the same label (a Collect's row).
  void Add(const OpTimeTotal& total);
  // The sums, largest total first (ties by label), and empties them.
  std::vector<OpTimeTotal> Take();

 private:
  absl::flat_hash_map<std::string, OpTimeTotal> sums_;
};

// Times each op by the host's steady clock: right for a backend whose ops
// have finished their work when they return (the CPU: its thread pool's
// loops and OpenBLAS return when done). Collect has nothing to wait for.
class WallClockOpTimer final : public OpTimer {
 public:
  void Begin() override;
  void End(std::string label) override;
  absl::StatusOr<std::vector<OpTimeTotal>> Collect() override;

 private:
  std::chrono::steady_clock::time_point start_;
  bool open_ = false;
  OpTimeSums sums_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_OP_TIMER_H_
