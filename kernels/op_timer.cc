#include "kernels/op_timer.h"

#include <algorithm>
#include <utility>

namespace tessera {

OpTimer::~OpTimer() = default;

void OpTimeSums::Add(std::string label, double us) {
  OpTimeTotal& total = sums_[label];
  if (total.label.empty()) total.label = std::move(label);
  ++total.calls;
  total.total_us += us;
}

void OpTimeSums::Add(const OpTimeTotal& total) {
  OpTimeTotal& sum = sums_[total.label];
  if (sum.label.empty()) sum.label = total.label;
  sum.calls += total.calls;
  sum.total_us += total.total_us;
}

std::vector<OpTimeTotal> OpTimeSums::Take() {
  std::vector<OpTimeTotal> out;
  out.reserve(sums_.size());
  for (auto& [label, total] : sums_) out.push_back(std::move(total));
  sums_.clear();
  std::sort(out.begin(), out.end(),
            [](const OpTimeTotal& a, const OpTimeTotal& b) {
              if (a.total_us != b.total_us) return a.total_us > b.total_us;
              return a.label < b.label;
            });
  return out;
}

void WallClockOpTimer::Begin() {
  start_ = std::chrono::steady_clock::now();
  open_ = true;
}

void WallClockOpTimer::End(std::string label) {
  if (!open_) return;  // An End without its Begin: nothing to measure.
  open_ = false;
  const std::chrono::duration<double, std::micro> us =
      std::chrono::steady_clock::now() - start_;
  sums_.Add(std::move(label), us.count());
}

absl::StatusOr<std::vector<OpTimeTotal>> WallClockOpTimer::Collect() {
  open_ = false;
  return sums_.Take();
}

}  // namespace tessera
