#include "launch/drain_timeout.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

DrainTimeout Resolve(double flag,
                     const std::map<std::string, std::string>& env) {
  return ResolveDrainTimeout(flag, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(DrainTimeoutTest, TheFlagWins) {
  EXPECT_EQ(Resolve(3.5, {{"OMPI_MCA_orte_hnp_uri", "x"}}).seconds, 3.5);
  EXPECT_EQ(Resolve(0, {}).seconds, 0);
  EXPECT_EQ(Resolve(0, {}).why, "--drain-timeout");
}

TEST(DrainTimeoutTest, UnderMpirunItEndsBeforeTheKill) {
  EXPECT_DOUBLE_EQ(Resolve(-1, {{"OMPI_MCA_orte_hnp_uri", "x"}}).seconds, 0.5);
  EXPECT_DOUBLE_EQ(Resolve(-1, {{"OMPI_MCA_orte_hnp_uri", "x"},
                                {"OMPI_MCA_odls_base_sigkill_timeout", "30"}})
                       .seconds,
                   29.5);
  // Never below 0.2 s, and a bad value is Open MPI's default.
  EXPECT_DOUBLE_EQ(Resolve(-1, {{"OMPI_MCA_orte_hnp_uri", "x"},
                                {"OMPI_MCA_odls_base_sigkill_timeout", "0"}})
                       .seconds,
                   0.2);
  EXPECT_DOUBLE_EQ(Resolve(-1, {{"OMPI_MCA_orte_hnp_uri", "x"},
                                {"OMPI_MCA_odls_base_sigkill_timeout", "soon"}})
                       .seconds,
                   0.5);
  // mpirun inside a Slurm job: mpirun's kill comes first.
  EXPECT_DOUBLE_EQ(
      Resolve(-1, {{"OMPI_MCA_orte_hnp_uri", "x"}, {"SLURM_JOB_ID", "7"}})
          .seconds,
      0.5);
}

TEST(DrainTimeoutTest, SlurmAndStandalone) {
  EXPECT_EQ(Resolve(-1, {{"SLURM_JOB_ID", "7"}}).seconds, 25);
  EXPECT_EQ(Resolve(-1, {{"SLURM_JOB_ID", ""}}).seconds, 8);
  EXPECT_EQ(Resolve(-1, {}).seconds, 8);
}

}  // namespace
}  // namespace tessera
