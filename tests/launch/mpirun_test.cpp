// mpirun (OpenMPI) as the launcher, for real: Debian's openmpi-bin starts two ddp-train workers,
// which take rank and world size from OMPI_COMM_WORLD_* and the store from MASTER_ADDR/PORT. The
// test setup (scripts/setup.sh) installs openmpi-bin, so a missing mpirun fails this test rather
// than skipping it. srun has no such test: there is no Slurm here, only the environment mapping
// (tests/comm/env_test.cpp).

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "ddp/launch/free_port.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::run_command;

// The flags a local mpirun needs here (docs/dependencies.md, "OpenMPI", says how each was found):
//   --allow-run-as-root  CI containers run as root, and mpirun refuses root without it
//   --oversubscribe      -np counts slots, by default one per core that hwloc finds: on a runner
//                        with fewer cores than ranks mpirun refuses to start at all
//   --bind-to none       not needed to run: mpirun would pin rank r to core r, and on these
//                        2 shared cores (ctest -j 2, other jobs) a pinned rank cannot move away
//                        from a busy core
// plus -x MASTER_ADDR -x MASTER_PORT: every rank gets them (local ranks would inherit them
// anyway; ranks on other hosts need -x).
const char* kMpirunFlags = "-np 2 --allow-run-as-root --oversubscribe --bind-to none";

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Mpirun, TrainsDdpTrainAtWorldTwoAndEndsWhereItsOwnLauncherEnds) {
  const auto [mpirun, found] = run_command("command -v mpirun");
  ASSERT_EQ(found, 0) << "mpirun is not installed: scripts/setup.sh installs Debian's openmpi-bin "
                         "for the tests (docs/dependencies.md)";
  const ddp::testing::TempDir dir("mpirun");
  const std::string train = std::string(DDP_TRAIN_PATH) +
                            " --model mlp --steps 60 --timeout-s 60 --save-weights " + dir.str();
  const std::string port = std::to_string(ddp::launch::find_free_port());
  // timeout: a rendezvous that never completes must not outlive the test's own bound.
  const auto [out, code] =
      run_command("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " timeout 120 mpirun " +
                  kMpirunFlags + " -x MASTER_ADDR -x MASTER_PORT " + train + "/mpirun.safetensors");
  ASSERT_EQ(code, 0) << out;
  // One job of two ranks: one header (rank 0's), world size 2. Ranks that ignored OMPI_* would
  // each spawn a job of their own: two headers, each with "[rank 0]" prefixes.
  EXPECT_EQ(count_of(out, "ddp-train: model mlp"), 1u) << out;
  EXPECT_NE(out.find("world size 2, backend gloo"), std::string::npos) << out;
  EXPECT_EQ(out.find("[rank "), std::string::npos) << out;
  const auto losses = ddp::testing::train_losses(out);
  ASSERT_TRUE(losses) << out;
  EXPECT_LT(losses->second, 0.7 * losses->first) << out;

  // The same job through ddp-train's own launcher (RANK, WORLD_SIZE): the same weights, bit for
  // bit, since only the launcher differs.
  const auto [own_out, own_code] = run_command(train + "/own.safetensors --nproc 2");
  ASSERT_EQ(own_code, 0) << own_out;
  const std::string a = file_bytes(dir.file("mpirun.safetensors"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == file_bytes(dir.file("own.safetensors")))
      << "mpirun's final parameters differ from ddp-train --nproc 2's";
}

}  // namespace
