// How long `tessera serve` lets requests in flight finish after SIGTERM or
// SIGINT before it aborts them (--drain-timeout).
//
// The drain must end before the launcher's kill follows its SIGTERM, or the
// clients of the requests still running are cut off without a word. The
// default ("auto", a negative flag) is read from the launcher:
//   - under mpirun (Open MPI's ORTE: OMPI_MCA_orte_hnp_uri is set), every rank
//     gets SIGTERM and then SIGKILL odls_base_sigkill_timeout seconds later
//     (1 s by default; `mpirun --mca odls_base_sigkill_timeout 30` and the
//     environment variable OMPI_MCA_odls_base_sigkill_timeout reach the ranks'
//     environment): that minus 0.5 s for telling the clients, at least 0.2 s;
//   - under Slurm (SLURM_JOB_ID set; srun, sbatch, salloc): 25 s, inside
//     Slurm's default KillWait of 30 s (a site with a shorter KillWait, or a
//     job sent `--signal`, sets --drain-timeout itself);
//   - otherwise 8 s, inside the 10 s `docker stop` waits (Kubernetes waits 30,
//     systemd 90).
#ifndef TESSERA_LAUNCH_DRAIN_TIMEOUT_H_
#define TESSERA_LAUNCH_DRAIN_TIMEOUT_H_

#include <functional>
#include <string>

namespace tessera {

struct DrainTimeout {
  double seconds = 0;
  std::string why;  // "--drain-timeout", or the launcher's rule above.
};

// `flag_seconds` >= 0 is taken as given; negative: the launcher's default.
// `getenv` reads the environment (std::getenv, or a test's).
DrainTimeout ResolveDrainTimeout(
    double flag_seconds, const std::function<const char*(const char*)>& getenv);

}  // namespace tessera

#endif  // TESSERA_LAUNCH_DRAIN_TIMEOUT_H_
