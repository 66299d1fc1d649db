#include "runtime/core/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

namespace tessera {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out,
                         bool interactive)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      out_(out),
      interactive_(interactive),
      start_(std::chrono::steady_clock::now()) {
  Draw();
}

ProgressBar ProgressBar::OnStderr(std::string label, int64_t total) {
  return ProgressBar(std::move(label), total, stderr, isatty(STDERR_FILENO));
}

ProgressBar::~ProgressBar() {
  // A load that failed half way: leave the cursor on a fresh line for the
  // error message.
  if (out_ != nullptr && interactive_ && !finished_) std::fputc('\n', out_);
}

void ProgressBar::Advance(int64_t parts) {
  done_ = std::min(total_, done_ + parts);
  Draw();
}

void ProgressBar::Finish() {
  if (finished_) return;
  done_ = total_;
  Draw();
  finished_ = true;
  if (out_ != nullptr && interactive_) std::fputc('\n', out_);
}

void ProgressBar::Draw() {
  if (out_ == nullptr || finished_) return;
  const int percent = static_cast<int>(done_ * 100 / total_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  if (interactive_) {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(done_ * kWidth / total_);
    std::fprintf(out_, "\r[tessera] %s [%s%s] %3d%% (%lld/%lld) %.1f s",
                 label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '-').c_str(), percent,
                 static_cast<long long>(done_), static_cast<long long>(total_),
                 seconds);
  } else {
    const int quarter = percent / 25;
    if (quarter == last_quarter_) return;
    last_quarter_ = quarter;
    std::fprintf(out_, "[tessera] %s: %d%% (%lld/%lld) %.1f s\n",
                 label_.c_str(), percent, static_cast<long long>(done_),
                 static_cast<long long>(total_), seconds);
  }
  std::fflush(out_);
}

}  // namespace tessera
