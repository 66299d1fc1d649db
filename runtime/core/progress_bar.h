// ProgressBar: how far a long load has come, for the person watching the
// startup log (rank 0 only; other ranks pass no stream).
//
// On a terminal the bar is one line redrawn in place:
//   [tessera] loading weights [##########----------]  50% (16/32) 1.2 s
// Elsewhere (a Slurm output file, a CI log) redrawing would leave control
// characters, so the bar prints one line at each further quarter instead.
#ifndef TESSERA_RUNTIME_CORE_PROGRESS_BAR_H_
#define TESSERA_RUNTIME_CORE_PROGRESS_BAR_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera {

class ProgressBar {
 public:
  // `out` null: the bar is silent. `total` <= 0 counts as 1.
  ProgressBar(std::string label, int64_t total, std::FILE* out,
              bool interactive);
  // On stderr, redrawn when stderr is a terminal.
  static ProgressBar OnStderr(std::string label, int64_t total);
  // Silent (for ranks other than 0).
  static ProgressBar Silent() { return ProgressBar("", 1, nullptr, false); }

  // Returned by value through C++17's guaranteed copy elision; never copied
  // or moved (a moved-from bar would still own the line).
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // Ends the line of an interactive bar that did not reach Finish().
  ~ProgressBar();

  void Advance(int64_t parts = 1);
  // Draws 100% (if not yet drawn) and ends the line.
  void Finish();

 private:
  void Draw();

  std::string label_;
  int64_t total_ = 1;
  int64_t done_ = 0;
  std::FILE* out_ = nullptr;
  bool interactive_ = false;
  int last_quarter_ = -1;  // Non-interactive: the last quarter printed.
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_PROGRESS_BAR_H_
