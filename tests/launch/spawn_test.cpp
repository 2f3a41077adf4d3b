#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>

#include "ddp/launch/spawn.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace ddp::launch {
namespace {

SpawnOptions shell(int nproc, const std::string& script) {
  SpawnOptions o;
  o.nproc = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.timeout = std::chrono::seconds(30);
  o.grace = std::chrono::milliseconds(200);
  // The test binary keeps its own signal handling (Ctrl-C must end it); ddp-run's tests cover
  // the forwarding.
  o.forward_signals = false;
  return o;
}

TEST(Spawn, SetsTheTorchrunEnvironment) {
  auto o = shell(3,
                 "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_WORLD_SIZE\" = 3 && "
                 "test \"$RANK\" = \"$LOCAL_RANK\" && test \"$MASTER_ADDR\" = 127.0.0.1 && "
                 "test \"$MASTER_PORT\" -gt 0 && test \"$EXTRA\" = yes");
  o.env["EXTRA"] = "yes";
  const SpawnResult r = spawn_local_workers(o);
  ASSERT_EQ(r.workers.size(), 3u);
  EXPECT_TRUE(r.ok()) << r.describe();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.workers[i].rank, i);
}

TEST(Spawn, AFailureIsDescribedByRank) {
  const SpawnResult r = spawn_local_workers(shell(3, "exit $(( RANK == 2 ? 12 : 0 ))"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.workers[2].exit_code, 12) << r.describe();
  EXPECT_FALSE(r.workers[2].killed_by_launcher);
  EXPECT_NE(r.describe().find("rank 2 exited with code 12"), std::string::npos) << r.describe();
}

TEST(Spawn, AllZeroIsOk) {
  const SpawnResult r = spawn_local_workers(shell(2, "exit 0"));
  EXPECT_TRUE(r.ok()) << r.describe();
}

TEST(Spawn, AFailureStopsTheOthers) {
  // Rank 0 fails at once; rank 1 would run for a minute and must be stopped after the grace.
  const auto start = std::chrono::steady_clock::now();
  const SpawnResult r =
      spawn_local_workers(shell(2, "if [ \"$RANK\" = 0 ]; then exit 3; fi; exec sleep 60"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(r.workers[0].exit_code, 3);
  EXPECT_TRUE(r.workers[1].signaled);
  EXPECT_TRUE(r.workers[1].killed_by_launcher);
  EXPECT_NE(r.describe().find("rank 1 killed by signal 15"), std::string::npos) << r.describe();
}

TEST(Spawn, AStoppedWorkerIsEndedWithoutWaitingForTheGrace) {
  // Rank 1 stops itself (as a SIGSTOPped or debugger-held worker); rank 0 fails once rank 1's
  // state is 'T'. The launcher's SIGTERM must reach the stopped worker at once (with SIGCONT),
  // not after the 30 s grace, when SIGKILL would.
  ddp::testing::TempDir dir("ddp_spawn_stop");
  auto o = shell(2,
                 "if [ \"$RANK\" = 1 ]; then echo $$ > \"$DIR/pid\"; kill -STOP $$; exec sleep 60; "
                 "fi; until grep -q ') T' /proc/$(cat \"$DIR/pid\" 2>/dev/null)/stat 2>/dev/null; "
                 "do sleep 0.02; done; exit 3");
  o.env["DIR"] = dir.str();
  o.grace = std::chrono::seconds(30);
  const auto start = std::chrono::steady_clock::now();
  const SpawnResult r = spawn_local_workers(o);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(r.workers[0].exit_code, 3) << r.describe();
  EXPECT_TRUE(r.workers[1].signaled);
  EXPECT_NE(r.describe().find("rank 1 killed by signal 15"), std::string::npos) << r.describe();
}

TEST(Spawn, TimeoutKillsEveryWorker) {
  auto o = shell(2, "exec sleep 60");
  o.timeout = std::chrono::milliseconds(300);
  const SpawnResult r = spawn_local_workers(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.workers[0].signaled && r.workers[1].signaled) << r.describe();
}

// Unsets a variable of this process for the scope of a test, restoring it afterwards.
class UnsetEnv {
 public:
  explicit UnsetEnv(const char* key) : key_(key) {
    if (const char* v = std::getenv(key)) saved_ = v;
    ::unsetenv(key);
  }
  ~UnsetEnv() {
    if (saved_) ::setenv(key_, saved_->c_str(), 1);
  }

 private:
  const char* key_;
  std::optional<std::string> saved_;
};

// --nproc workers get what ddp-run's get: OMP_NUM_THREADS=1 (more than one worker, none set),
// DDP_RESTART_COUNT=0, GROUP_RANK=0, and their lines prefixed with their rank on the same stream.
TEST(Spawn, WorkersGetTheDdpRunEnvironmentAndRankPrefixes) {
  UnsetEnv omp("OMP_NUM_THREADS");
  auto o = shell(2,
                 "echo \"omp=$OMP_NUM_THREADS restart=$DDP_RESTART_COUNT group=$GROUP_RANK "
                 "rank=$RANK\"; echo \"err $RANK\" >&2");
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const SpawnResult r = spawn_local_workers(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.describe();
  for (const std::string rank : {"0", "1"}) {
    EXPECT_NE(out.find("[rank " + rank + "] omp=1 restart=0 group=0 rank=" + rank + "\n"),
              std::string::npos)
        << out;
    EXPECT_NE(err.find("[rank " + rank + "] err " + rank + "\n"), std::string::npos) << err;
  }
}

// A thread count the user set and a restart count handed down by an outer launcher pass through.
TEST(Spawn, KeepsASetThreadCountAndPassesTheRestartCountOn) {
  auto o = shell(2, "echo \"omp=$OMP_NUM_THREADS restart=$DDP_RESTART_COUNT\"");
  o.env["OMP_NUM_THREADS"] = "3";
  o.restart_count = 2;
  ::testing::internal::CaptureStdout();
  const SpawnResult r = spawn_local_workers(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(out.find("[rank 1] omp=3 restart=2\n"), std::string::npos) << out;
}

// fork_main: each worker is a fork of this process running the function, with its own
// environment (the launcher's variables and the extra ones), its lines prefixed as an exec'd
// worker's, its return value its exit code, and nothing of the parent's buffered output again.
TEST(Spawn, AForkedWorkerRunsTheFunctionWithItsEnvironment) {
  SpawnOptions o = shell(3, "exit 99");  // argv names the workers only
  o.env["EXTRA"] = "forked";
  o.fork_main = [] {
    const std::string rank = std::getenv("RANK");
    std::printf("rank=%s world=%s extra=%s\n", rank.c_str(), std::getenv("WORLD_SIZE"),
                std::getenv("EXTRA"));
    return rank == "2" ? 7 : 0;
  };
  ::testing::internal::CaptureStdout();
  std::printf("parent's unflushed line\n");  // still in our stdio buffer when the workers fork
  const SpawnResult r = spawn_local_workers(o);
  std::fflush(stdout);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(r.workers.size(), 3u);
  EXPECT_EQ(r.workers[0].exit_code, 0) << r.describe();
  EXPECT_EQ(r.workers[2].exit_code, 7) << r.describe();
  for (const std::string rank : {"0", "2"}) {
    EXPECT_NE(out.find("[rank " + rank + "] rank=" + rank + " world=3 extra=forked\n"),
              std::string::npos)
        << out;
  }
  const size_t first = out.find("parent's unflushed line");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_EQ(out.find("parent's unflushed line", first + 1), std::string::npos) << out;
}

#ifdef DDP_TRAIN_PATH
// The tools' --nproc goes through the same launcher: ddp-train's workers' lines carry the prefix.
TEST(Spawn, DdpTrainNprocWorkersArePrefixed) {
  const auto [out, code] = ddp::testing::run_command(
      std::string(DDP_TRAIN_PATH) + " --nproc 2 --model mlp --steps 2 --timeout-s 60");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("[rank 0] ddp-train: model mlp"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0] ddp-train: loss "), std::string::npos) << out;
  EXPECT_EQ(out.find("[rank 1] ddp-train: loss "), std::string::npos) << out;  // rank 0 reports
}
#endif

TEST(Spawn, FreePortIsUsable) {
  const uint16_t a = find_free_port();
  EXPECT_GT(a, 0);
}

TEST(Spawn, ZeroWorkersIsABadFlag) {
  auto o = shell(0, "exit 0");
  try {
    spawn_local_workers(o);
    FAIL() << "nproc 0 must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc must be at least 1, got 0"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddp::launch
