// A rank SIGSTOPped at a random moment of a real job (ddp-train --nproc on Gloo, worlds 2 and 3,
// 20 runs each, every rank stopped in turn, rank 0 and its store included): the others time out,
// the launcher stops the job, every rank leaves a whole dump (no temporary file behind), and
// ddp-forensics' first line names the stopped rank every time, whether it stopped inside a
// collective, between two, or ran on once the launcher continued it. Four jobs run at a time: a
// run spends most of its ~7 s waiting (the 2 s timeout, the launcher's stop), so four take about
// the time of one; each job has its own ports, directory and files.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ddp/files/posix_file.hpp"
#include "support/launched_job.hpp"
#include "support/param_names.hpp"
#include "support/temp_dir.hpp"

namespace ddp::testing {
namespace {

#if defined(DDP_TRAIN_PATH) && defined(DDP_FORENSICS_PATH)

struct StoppedRun {
  std::string first_line;  // ddp-forensics'
  std::string log;         // the launcher's output
  std::vector<std::string> files;
};

// One job: training runs (rank 0 has printed step 20), then `rank` is stopped after `delay`. A job
// that never got to training (a 2 s rendezvous missed on a loaded machine: not what is tested
// here) is started again, at most twice more.
StoppedRun stop_one(int world, int rank, std::chrono::milliseconds delay) {
  TempDir dir("stopped_rank");
  const std::string dumps = dir.file("dumps");
  StoppedRun run;
  for (int attempt = 0; attempt < 3; ++attempt) {
    files::remove_tree(dumps);
    LaunchedJob job(std::string(DDP_TRAIN_PATH) + " --nproc " + std::to_string(world) +
                        " --model mlp --steps 1000000 --timeout-s 2 --flight-recorder " + dumps,
                    dir.file("launcher.log"));
    const pid_t victim =
        job.wait_for_output("step 20/", std::chrono::seconds(60)) ? job.worker(rank) : -1;
    if (victim > 0) {
      std::this_thread::sleep_for(delay);  // the random moment to stop it at, not a synchronisation
      ::kill(victim, SIGSTOP);
    }
    const int status = job.wait(std::chrono::seconds(60));
    run.log = job.output() + "\n(launcher status " + std::to_string(status) + ")";
    run.files = names_in(dumps);
    if (victim <= 0) {
      run.first_line = "(rank " + std::to_string(rank) + "'s worker was not found)";
      continue;
    }
    // Into a file, not a pipe: a pipe's write end would leak into the other thread's job,
    // forked meanwhile, and hold the read open until that job ended.
    LaunchedJob forensics(std::string(DDP_FORENSICS_PATH) + " " + dumps, dir.file("forensics.log"));
    const int ended = forensics.wait(std::chrono::seconds(60));
    const std::string out = forensics.output();
    run.first_line = out.substr(0, out.find('\n'));
    if (!WIFEXITED(ended) || WEXITSTATUS(ended) != 0) {
      run.first_line += " (ddp-forensics wait status " + std::to_string(ended) + ")";
    }
    break;
  }
  return run;
}

class StoppedRank : public ::testing::TestWithParam<int> {};

TEST_P(StoppedRank, ForensicsNamesTheStoppedRankInEveryRun) {
  constexpr int kRuns = 20;
  constexpr int kAtOnce = 4;
  const int world = GetParam();
  std::mt19937 draw(static_cast<uint32_t>(world));
  std::uniform_int_distribution<int> delay_ms(0, 300);
  std::vector<std::chrono::milliseconds> delays;
  for (int k = 0; k < kRuns; ++k) delays.emplace_back(delay_ms(draw));
  // kAtOnce threads take the next run as each finishes: no run waits on a slower one.
  std::vector<StoppedRun> runs(kRuns);
  std::atomic<int> next{0};
  std::vector<std::future<void>> takers;
  for (int t = 0; t < kAtOnce; ++t) {
    takers.push_back(std::async(std::launch::async, [&] {
      for (int k = next++; k < kRuns; k = next++) runs[k] = stop_one(world, k % world, delays[k]);
    }));
  }
  for (auto& taker : takers) taker.get();
  for (int k = 0; k < kRuns; ++k) {
    const int rank = k % world;
    const StoppedRun& run = runs[k];
    SCOPED_TRACE("run " + std::to_string(k) + ", rank " + std::to_string(rank) + " stopped\n" +
                 run.log);
    EXPECT_EQ(run.first_line.rfind("rank " + std::to_string(rank) + " ", 0), 0u) << run.first_line;
    EXPECT_NE(run.first_line.find(" stopped "), std::string::npos) << run.first_line;
    // Every rank's dump, whole, and nothing else: no temporary file left by a cut-short write.
    std::vector<std::string> expected;
    for (int r = 0; r < world; ++r) expected.push_back("flight-rank" + std::to_string(r) + ".json");
    std::vector<std::string> files = run.files;
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, StoppedRank, ::testing::Values(2, 3), world_name);

#endif

}  // namespace
}  // namespace ddp::testing
