#include <gtest/gtest.h>

#include "ddp/launch/spawn.hpp"

namespace ddp::launch {
namespace {

SpawnOptions shell(int nproc, const std::string& script) {
  SpawnOptions o;
  o.nproc = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.timeout = std::chrono::seconds(30);
  o.grace = std::chrono::milliseconds(200);
  return o;
}

TEST(Spawn, SetsTheTorchrunEnvironment) {
  auto o = shell(3,
                 "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_WORLD_SIZE\" = 3 && "
                 "test \"$RANK\" = \"$LOCAL_RANK\" && test \"$MASTER_ADDR\" = 127.0.0.1 && "
                 "test \"$MASTER_PORT\" -gt 0 && test \"$EXTRA\" = yes && exit $((10 + RANK))");
  o.env["EXTRA"] = "yes";
  const SpawnResult r = spawn_local_workers(o);
  ASSERT_EQ(r.workers.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.workers[i].exit_code, 10 + i) << r.describe();
  EXPECT_FALSE(r.ok());
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

TEST(Spawn, TimeoutKillsEveryWorker) {
  auto o = shell(2, "exec sleep 60");
  o.timeout = std::chrono::milliseconds(300);
  const SpawnResult r = spawn_local_workers(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.workers[0].signaled && r.workers[1].signaled) << r.describe();
}

TEST(Spawn, FreePortIsUsable) {
  const uint16_t a = find_free_port();
  EXPECT_GT(a, 0);
}

TEST(Spawn, ZeroWorkersIsABadFlag) {
  auto o = shell(0, "exit 0");
  try {
    spawn_local_workers(o);
    FAIL() << "nproc 0 must be refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc must be at least 1, got 0"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddp::launch
