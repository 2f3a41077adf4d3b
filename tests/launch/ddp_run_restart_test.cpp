// ddp-run's restarts: the group restarted after a failure, each restart with its cause; the
// restarts spent; a restart loop stopped; a slot that fails at start-up dropped (--min-nproc);
// and a real ddp-train job resumed from its checkpoint, bit for bit.

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launch/ddp_run_harness.hpp"

namespace {

using namespace ddp::testing;

TEST(DdpRun, RestartsTheGroupAfterAFailure) {
  TempDir dir;
  const auto f = ddp_run(sh({"--nproc-per-node", "2", "--max-restarts", "1"},
                            "echo \"attempt $DDP_RESTART_COUNT\"; "
                            "if [ $DDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 5; fi"),
                         dir);
  EXPECT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 5\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("ddp-run: restarting the group (restart 1 of 1) after rank 1 exited with "
                       "code 5\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.out.find("[rank 0] attempt 1\n"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("[rank 1] attempt 1\n"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("attempt 2"), std::string::npos) << f.out;
}

TEST(DdpRun, GivesUpWhenTheRestartsAreSpent) {
  TempDir dir;
  const auto f =
      ddp_run(sh({"--max-restarts", "2"}, "echo \"attempt $DDP_RESTART_COUNT\"; exit 4"), dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_EQ(count(f.err, "ddp-run: rank 0 exited with code 4\n"), 3) << f.err;
  EXPECT_NE(f.err.find("(restart 1 of 2)"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("(restart 2 of 2)"), std::string::npos) << f.err;
  EXPECT_EQ(f.out, "[rank 0] attempt 0\n[rank 0] attempt 1\n[rank 0] attempt 2\n");
}

// The launcher channel (DDP_LAUNCHER_FD) carries the step a worker reached: a worker that fails
// at the same step again after a restart is a restart loop, and the launcher stops there instead
// of spending every restart on it.
TEST(DdpRun, StopsARestartLoopAtTheSameFailureAtTheSameStep) {
  TempDir dir;
  const auto f =
      ddp_run(sh({"--max-restarts", "5"},
                 "echo \"attempt $DDP_RESTART_COUNT\"; echo ready >/dev/fd/$DDP_LAUNCHER_FD; "
                 "echo 'step 7' >/dev/fd/$DDP_LAUNCHER_FD; exit 4"),
              dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_EQ(count(f.err, "ddp-run: rank 0 exited with code 4 at step 7\n"), 2) << f.err;
  EXPECT_NE(f.err.find("ddp-run: restarting the group (restart 1 of 5) after rank 0 exited with "
                       "code 4 at step 7\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find("ddp-run: not restarting: rank 0 exited with code 4 at step 7 again, as in "
                       "the attempt before (a restart loop: the same failure at the same step)\n"),
            std::string::npos)
      << f.err;
  EXPECT_EQ(f.out, "[rank 0] attempt 0\n[rank 0] attempt 1\n");
}

// --min-nproc: a worker that fails at start-up (never "ready" on the launcher channel) on a
// restart has its slot dropped; the others go on as a smaller world, renumbered, each still
// finding its own GPU (CUDA_VISIBLE_DEVICES names the slots left), told the world it started with.
TEST(DdpRun, GoesOnWithFewerWorkersWhenASlotFailsAtStartUp) {
  TempDir dir;
  const auto f = ddp_run(
      sh({"--nproc-per-node", "3", "--max-restarts", "2", "--min-nproc", "2"},
         "if [ $DDP_RESTART_COUNT = 1 ] && [ $LOCAL_RANK = 1 ]; then exit 4; fi; "
         "echo ready >/dev/fd/$DDP_LAUNCHER_FD; "
         "if [ $DDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 9; fi; "
         "echo \"attempt $DDP_RESTART_COUNT world $WORLD_SIZE of $DDP_STARTED_WORLD_SIZE local "
         "$LOCAL_RANK/$LOCAL_WORLD_SIZE devices ${CUDA_VISIBLE_DEVICES:-all}\""),
      dir);
  EXPECT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 9\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 4\nddp-run: rank 1 (slot 1) failed at "
                       "start-up; going on with 2 workers (--min-nproc 2)\nddp-run: restarting "
                       "the group (restart 2 of 2) after rank 1 exited with code 4\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.out.find("[rank 0] attempt 2 world 2 of 3 local 0/2 devices 0,2\n"),
            std::string::npos)
      << f.out;
  EXPECT_NE(f.out.find("[rank 1] attempt 2 world 2 of 3 local 1/2 devices 0,2\n"),
            std::string::npos)
      << f.out;
  EXPECT_EQ(count(f.out, "attempt 2"), 2) << f.out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The restart test: rank 1 dies at step 7 (after the step-5 checkpoint); ddp-run stops
// rank 0, restarts the group with DDP_RESTART_COUNT=1, the workers resume from step 5, and the
// final parameters equal an uninterrupted run's, bit for bit.
TEST(DdpRun, MaxRestartsResumesFromTheCheckpointAndEqualsAnUninterruptedRun) {
  TempDir dir;
  const std::vector<std::string> train = {DDP_TRAIN_PATH, "--model",     "mlp", "--steps",
                                          "10",           "--timeout-s", "60"};
  auto args = [&](std::vector<std::string> launcher, std::vector<std::string> extra) {
    launcher.push_back("--");
    launcher.insert(launcher.end(), train.begin(), train.end());
    launcher.insert(launcher.end(), extra.begin(), extra.end());
    return launcher;
  };
  const auto straight = ddp_run(
      args({"--nproc-per-node", "2"}, {"--save-weights", dir.file("straight.safetensors")}), dir);
  ASSERT_EQ(straight.code, 0) << straight.out << straight.err;
  const auto restarted = wait_ddp_run(
      start_ddp_run(
          args({"--nproc-per-node", "2", "--max-restarts", "1"},
               {"--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "5", "--fail-at-step",
                "7", "--fail-rank", "1", "--save-weights", dir.file("restarted.safetensors")}),
          dir, "restart"),
      150s);
  ASSERT_EQ(restarted.code, 0) << restarted.out << restarted.err;
  const std::string all = restarted.out + restarted.err;
  EXPECT_NE(all.find("ddp-run: rank 1 exited with code 3"), std::string::npos) << all;
  EXPECT_NE(all.find("ddp-run: restarting the group (restart 1 of 1)"), std::string::npos) << all;
  EXPECT_NE(all.find("[rank 0] ddp-train: resumed from " + dir.file("ckpt") + "/step-5 at step 5"),
            std::string::npos)
      << all;
  const std::string a = file_bytes(dir.file("straight.safetensors"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == file_bytes(dir.file("restarted.safetensors")))
      << "the restarted run's final parameters differ from the uninterrupted run's";
}

}  // namespace
