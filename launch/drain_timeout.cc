#include "launch/drain_timeout.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tessera {

DrainTimeout ResolveDrainTimeout(
    double flag_seconds,
    const std::function<const char*(const char*)>& getenv) {
  if (flag_seconds >= 0) return {flag_seconds, "--drain-timeout"};
  const auto set = [&](const char* name) {
    const char* value = getenv(name);
    return value != nullptr && value[0] != '\0';
  };
  if (set("OMPI_MCA_orte_hnp_uri")) {
    double kill_after = 1.0;  // Open MPI's default.
    const char* given = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    double parsed = 0;
    if (given != nullptr && absl::SimpleAtod(given, &parsed) && parsed >= 0) {
      kill_after = parsed;
    }
    return {std::max(0.2, kill_after - 0.5),
            absl::StrFormat("mpirun kills %g s after its SIGTERM "
                            "(odls_base_sigkill_timeout), less 0.5 s",
                            kill_after)};
  }
  if (set("SLURM_JOB_ID")) {
    return {25.0, "inside Slurm's default KillWait of 30 s"};
  }
  return {8.0, "inside docker stop's 10 s"};
}

}  // namespace tessera
