// Hang forensics end to end on Gloo (worlds 2 and 3): a job goes wrong in one of the ways that
// hang real jobs, every rank that can dumps its flight recorder, and ddp-forensics names the first
// divergence in its first line.
//   - the last rank is SIGKILLed after collective #1: it leaves no dump; the others ended in #2;
//   - the last rank is SIGSTOPped after #1: the others time out in #2; it never dumps either;
//   - the last rank takes another branch of the user's code at #2 (the same all-reduce, but its
//     checkpoint's instead of the step's: nothing hangs, the results are silently wrong): the
//     collective that differs, rank by rank.

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "ddp/comm/recorder/flight_recorder.hpp"
#include "support/param_names.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

#ifdef DDP_FORENSICS_PATH  // the tool is built with the tools

struct ScenarioCase {
  std::string scenario;  // what the last rank does after #1: kill, stop or branch
  DDP_CASE_FIELDS(scenario)
};

// Collective #1 on every rank, then what the scenario makes the last rank do; the others issue
// #2 and fail or time out after 2 s (dumping), and report back by exiting 0.
DDP_TEST_WORKER_WITH(forensics_scenario, ScenarioCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(2));
  const std::string& scenario = c.scenario;
  const bool odd = pg->rank() == pg->world_size() - 1;
  auto t = torch::ones({4});
  comm::note_step(3);
  {
    const comm::ForPurpose purpose({comm::Purpose::kBucket, 0, 0});
    pg->allreduce_sum(t, "first all-reduce");
  }
  if (odd && scenario == "kill") ::raise(SIGKILL);
  if (odd && scenario == "stop") {
    // Rank 0 ends it once it has timed out (as the launcher would), so the job is not left behind.
    const std::string pid = std::to_string(::getpid());
    pg->store().set("test/stopped-pid", std::vector<uint8_t>(pid.begin(), pid.end()));
    ::raise(SIGSTOP);
  }
  if (odd && scenario == "branch") {
    const comm::ForPurpose purpose({comm::Purpose::kCheckpoint});
    pg->allreduce_sum(t, "the other branch's all-reduce");
    comm::dump_flight_recorder("test: after the branch");
    return;
  }
  try {
    pg->allreduce_sum(t, "second all-reduce");
  } catch (const c10::Error&) {
    // Dumped by the failed wait. Rank 0 ends the stopped rank only once every waiting rank has
    // timed out and dumped: ended sooner, the launcher's SIGTERM would find a slower rank still
    // waiting, and its dump would say so.
    if (scenario == "stop") {
      pg->store().set("test/timed-out/" + std::to_string(pg->rank()), std::vector<uint8_t>{1});
      if (pg->rank() == 0) {
        std::vector<std::string> keys;
        for (int r = 0; r + 1 < pg->world_size(); ++r) {
          keys.push_back("test/timed-out/" + std::to_string(r));
        }
        pg->store().wait(keys, std::chrono::seconds(20));
        const auto pid = pg->store().get("test/stopped-pid");
        ::kill(std::stoi(std::string(pid.begin(), pid.end())), SIGKILL);
      }
    }
    return;
  }
  comm::dump_flight_recorder("test: after the second all-reduce");
}

std::string forensics_of(const std::string& scenario, int world, const TempDir& dir) {
  run_workers(forensics_scenario, world, ScenarioCase{scenario},
              {{"DDP_FLIGHT_RECORDER_DIR", dir.path.string()}}, std::chrono::seconds(30));
  const auto [out, code] =
      run_command(std::string(DDP_FORENSICS_PATH) + " " + dir.path.string() + " 2>&1");
  EXPECT_EQ(code, 0) << out;
  return out.substr(0, out.find('\n'));
}

std::string others(int world) { return world == 2 ? "rank 0" : "ranks 0 and 1"; }

// The first words when the last rank left no dump and the others agree, then who the others are.
std::string left_no_dump(int world) {
  return "rank " + std::to_string(world - 1) +
         " left no dump (killed, or never started) and the others agree on every collective they "
         "hold; " +
         others(world);
}

class Forensics : public ::testing::TestWithParam<int> {};

TEST_P(Forensics, AKilledRankIsNamedAndWhereTheOthersEnded) {
  const int world = GetParam();
  TempDir dir("forensics");
  const std::string line = forensics_of("kill", world, dir);
  EXPECT_EQ(line.rfind(left_no_dump(world), 0), 0u) << line;
  // "ended in" (their wait failed first) or "wait in" (the launcher's SIGTERM came first).
  EXPECT_NE(line.find(" in collective #2 of group ddp/world (all-reduce (sum) of 4 Float elements "
                      "for the user's own call, step 3, issued at "),
            std::string::npos)
      << line;
}

TEST_P(Forensics, AStoppedRankIsNamedAndTheOthersTimedOut) {
  const int world = GetParam();
  TempDir dir("forensics");
  const std::string line = forensics_of("stop", world, dir);
  const std::string head = left_no_dump(world) + " ended in collective #2 of group ddp/world ";
  EXPECT_EQ(line.rfind(head, 0), 0u) << line;
  EXPECT_NE(line.find(", timed out)"), std::string::npos) << line;
}

TEST_P(Forensics, RanksInDifferentBranchesAreNamedAtTheCollectiveThatDiffers) {
  const int world = GetParam();
  TempDir dir("forensics");
  const std::string line = forensics_of("branch", world, dir);
  EXPECT_EQ(line,
            "collective #2 of group ddp/world differs: " + others(world) +
                " issued all-reduce (sum) of 4 Float elements for the user's own call; rank " +
                std::to_string(world - 1) +
                " issued all-reduce (sum) of 4 Float elements for checkpoint");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Forensics, ::testing::Values(2, 3), world_name);

#endif

}  // namespace
}  // namespace ddp::testing
