#include "parallel/process_grid.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<ProcessGrid> ProcessGrid::Create(int world_size, int tp,
                                                int pp) {
  if (tp < 1 || pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp and --pp must be >= 1, got tp=", tp, " pp=", pp));
  }
  if (world_size != tp * pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has ", world_size, " ranks but tp × pp = ", tp,
                     " × ", pp, " = ", tp * pp, "; they must be equal"));
  }
  return ProcessGrid(tp, pp);
}

}  // namespace tessera
