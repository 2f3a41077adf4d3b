// ddp-bench and ddp-train agree on how a style is chosen (issue 46): the same flags (--style, and
// its short forms --ddp and --fsdp), the same refusal of two that disagree, before any worker
// starts; both refuse --nproc under another launcher and --device cuda without a device by name;
// ddp-train --json's stdout under --nproc parses as JSON lines (the ranks' initialisation, then
// the steps).

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "support/run_command.hpp"

namespace {

using ddp::testing::run_command;

const std::vector<std::pair<std::string, std::string>> kTools = {
    {"ddp-bench", std::string(DDP_BENCH_PATH) + " --model toy --repeat 1 --warmup 0"},
    {"ddp-train", std::string(DDP_TRAIN_PATH) + " --model net --dim 64 --steps 1"}};

TEST(ToolAgreement, StylesThatDisagreeAreRefusedAlikeBeforeAnyWorker) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--fsdp --style replicate",
       "--style replicate and --fsdp name different styles (replicate, fully_shard): give one"},
      {"--ddp --fsdp", "--ddp and --fsdp name different styles (replicate, fully_shard): give one"},
      {"--ddp --style default",
       "--style default and --ddp name different styles (default, replicate): give one"},
      {"--fsdp --comm-hook powersgd",
       "--style fully_shard cannot be combined with --comm-hook powersgd "
       "(DistributedDataParallel's)"}};
  for (const auto& [tool, command] : kTools) {
    for (const auto& [flags, error] : cases) {
      const auto [out, code] = run_command(command + " --nproc 2 " + flags);
      EXPECT_EQ(code, 2) << tool << " " << flags << ": " << out;
      // Once, from the tool itself: no worker ran to repeat it.
      EXPECT_EQ(out, tool + ": " + error + "\n") << tool << " " << flags;
    }
  }
}

TEST(ToolAgreement, EveryWayOfNamingReplicateRunsDdpInBothTools) {
  for (const auto& [tool, command] : kTools) {
    for (const std::string flags : {"--ddp", "--style replicate", "--ddp --style replicate"}) {
      const auto [out, code] = run_command(command + " --nproc 2 --timeout-s 60 " + flags);
      EXPECT_EQ(code, 0) << tool << " " << flags << ": " << out;
    }
  }
  // ddp-bench's result line names the style and --tp it measured.
  const auto [bench, bench_code] =
      run_command(kTools[0].second + " --nproc 2 --timeout-s 60 --style replicate");
  ASSERT_EQ(bench_code, 0) << bench;
  EXPECT_NE(bench.find(" repeat=1 style=replicate tp=0\n"), std::string::npos) << bench;
  // ddp-train's header names DDP's buckets (a sharded style names its units instead).
  const auto [out, code] =
      run_command(kTools[1].second + " --nproc 2 --timeout-s 60 --style replicate");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(" 16640 parameters in 1 bucket, world size 2,"), std::string::npos) << out;
}

// ddp-train's header counts the whole model's parameters whatever splits it (under --tp it
// printed a rank's share).
TEST(ToolAgreement, TheParameterCountIsTheWholeModelsUnderEveryStyleAndTp) {
  for (const std::string flags : {"--ddp", "--fsdp", "--ddp --tp 2", "--fsdp --tp 2"}) {
    const auto [out, code] = run_command(kTools[1].second + " --nproc 2 --timeout-s 60 " + flags);
    ASSERT_EQ(code, 0) << flags << ": " << out;
    // Net(64): four Linear(64, 64), 4 x (64 x 64 + 64).
    EXPECT_NE(out.find("ddp-train: model net, 16640 parameters in "), std::string::npos)
        << flags << ": " << out;
  }
}

// ddp-train --nproc on a terminal draws rank 0's progress bar (the workers' own stdout is a pipe,
// so it never appeared): run under script(1), which gives the launcher a pseudo-terminal.
TEST(ToolAgreement, DdpTrainDrawsItsProgressBarWhenTheLaunchersOutputIsATerminal) {
  const auto [out, code] =
      run_command("script -qec '" + std::string(DDP_TRAIN_PATH) +
                  " --model net --dim 64 --nproc 2 --steps 3 --timeout-s 60' /dev/null");
  EXPECT_EQ(code, 0) << out;
  // 30 columns, a third done after step 1 of 3; redrawn in place.
  EXPECT_NE(out.find("\r[##########....................] step 1/3  loss "), std::string::npos)
      << out;
  EXPECT_NE(out.find("\r[##############################] step 3/3  loss "), std::string::npos)
      << out;
}

// --verbose prints the bucket table once per job (under --tp every dp group has a rank 0).
TEST(ToolAgreement, VerboseTablesOncePerJobUnderTp) {
  for (const auto& [tool, command] : kTools) {
    const auto [out, code] =
        run_command(command + " --ddp --nproc 4 --tp 2 --timeout-s 60 --verbose");
    ASSERT_EQ(code, 0) << tool << ": " << out;
    size_t tables = 0;
    for (size_t at = out.find("DDP bucket assignment"); at != std::string::npos;
         at = out.find("DDP bucket assignment", at + 1)) {
      ++tables;
    }
    EXPECT_EQ(tables, 1u) << tool << ": " << out;
  }
}

// The runtime stats name the style that produced them (a FULLY_SHARD run printed "DDP runtime
// stats").
TEST(ToolAgreement, RuntimeStatsNameTheStyle) {
  const auto [out, code] =
      run_command(kTools[1].second + " --nproc 2 --timeout-s 60 --fsdp --verbose");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("fully_shard runtime stats (rank 0 of 2, gloo"), std::string::npos) << out;
  EXPECT_EQ(out.find("DDP runtime stats"), std::string::npos) << out;
}

TEST(ToolAgreement, NprocUnderAnotherLauncherIsRefusedByName) {
  // As ddp-run, torchrun or mpirun would have started the tool: their rank variables set.
  const std::string launched =
      "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 "
      "MASTER_PORT=1 ";
  for (const auto& [tool, command] : kTools) {
    const auto [out, code] = run_command(launched + command + " --ddp --nproc 2");
    EXPECT_EQ(code, 2) << tool << ": " << out;
    EXPECT_EQ(out, tool +
                       ": --nproc 2 under a launcher (torchrun's rank variables are set, "
                       "WORLD_SIZE=2): the launcher starts the ranks, so each of its processes "
                       "would start a separate world of 2; drop --nproc\n")
        << tool;
  }
  // A launcher of one process (a Slurm batch step has SLURM_PROCID=0, SLURM_NTASKS=1) leaves
  // --nproc to start the tool's own workers.
  const auto [out, code] = run_command("env SLURM_PROCID=0 SLURM_NTASKS=1 " + kTools[1].second +
                                       " --ddp --nproc 2 --timeout-s 60");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("world size 2,"), std::string::npos) << out;
}

TEST(ToolAgreement, DdpTrainJsonStdoutParsesLineByLineUnderNproc) {
  const auto [out, code] = run_command(
      std::string(DDP_TRAIN_PATH) +
      " --nproc 2 --model net --dim 64 --steps 3 --json --timeout-s 60 2>/dev/null | "
      "/usr/bin/python3 -c "
      "'import json, sys; lines = [json.loads(l) for l in sys.stdin]; "
      "assert len(lines[0][\"init_s\"]) == len(lines[0][\"init_peak_bytes\"]) == 2, lines; "
      "assert [l[\"step\"] for l in lines[1:]] == [1, 2, 3], lines; "
      "print(\"parsed\", len(lines))'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, "parsed 4\n");
}

// --tp that cannot split the world --nproc makes is refused once, before any worker starts (it
// was printed once per rank, behind the launcher's summary).
TEST(ToolAgreement, TpThatCannotSplitTheWorldIsRefusedBeforeAnyWorker) {
  for (const auto& [tool, command] : kTools) {
    const auto [out, code] = run_command(command + " --ddp --nproc 3 --tp 2");
    EXPECT_EQ(code, 2) << tool << ": " << out;
    EXPECT_EQ(out, tool + ": --tp 2 does not divide the world size 3\n");
  }
}

// A schedule checked against the model's own rate (no --lr) is refused once, before any worker
// starts: the rate comes from the registry without building the model (it was checked in each
// worker, once per rank, behind the launcher's summary).
TEST(ToolAgreement, AScheduleAboveTheModelsRateIsRefusedBeforeAnyWorker) {
  for (const auto& [tool, command] : kTools) {
    const auto [out, code] = run_command(command + " --ddp --nproc 2 --min-lr 1");
    EXPECT_EQ(code, 2) << tool << ": " << out;
    // ddp-bench's toy: 0.01; ddp-train's Net(64): min(0.05, 20 / width).
    const std::string rate = tool == "ddp-bench" ? "0.01" : "0.05";
    EXPECT_EQ(out, tool + ": --min-lr must be between 0 and --lr (" + rate + "), got 1\n");
  }
}

// A mistyped flag gets the nearest known one, in both tools, and nothing runs.
TEST(ToolAgreement, AnUnknownFlagNamesTheNearestKnownOne) {
  auto [out, code] = run_command(std::string(DDP_TRAIN_PATH) + " --stpes 10");
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "ddp-train: unknown flag --stpes; did you mean --steps?\n");
  std::tie(out, code) = run_command(std::string(DDP_BENCH_PATH) + " --repaet=3");
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "ddp-bench: unknown flag --repaet; did you mean --repeat?\n");
  std::tie(out, code) = run_command(std::string(DDP_TRAIN_PATH) + " --quux");
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "ddp-train: unknown flag --quux; see --help\n");
}

// Every tool answers a bad value the same way: one line naming the flag, exit 2 (ddp-train exited
// 105, CLI11's own code; trace-svg 1), and an unknown flag gets the nearest known one.
TEST(ToolAgreement, EveryToolRefusesABadValueWithOneLineAndExitTwo) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"ddp-train", std::string(DDP_TRAIN_PATH) + " --steps ten",
       "ddp-train: --steps: Value ten not in range 1 to 1000000; see --help\n"},
      {"ddp-bench", std::string(DDP_BENCH_PATH) + " --repeat 0",
       "ddp-bench: --repeat: Value 0 not in range 1 to 1000000; see --help\n"},
      {"trace-svg", std::string(TRACE_SVG_PATH) + " in.json -o out.svg --width narrow",
       "trace-svg: --width: Value narrow not in range 300.000000 to 100000.000000; see --help\n"},
      {"ddp-forensics", std::string(DDP_FORENSICS_PATH) + " --jsn dir",
       "ddp-forensics: unknown flag --jsn; did you mean --json?\n"},
      {"ddp-run", std::string(DDP_RUN_PATH) + " --bogus",
       "ddp-run: unknown flag --bogus; see --help\n"},
      {"ddp-run", std::string(DDP_RUN_PATH) + " --nproc-per-nod 2 -- true",
       "ddp-run: unknown flag --nproc-per-nod; did you mean --nproc-per-node?\n"}};
  for (const auto& [tool, command, want] : cases) {
    const auto [out, code] = run_command(command);
    EXPECT_EQ(code, 2) << tool << ": " << out;
    EXPECT_EQ(out, want) << tool;
  }
}

// --json: stdout is the JSON objects alone, every line parses (ddp-bench printed its "mean
// latency" line after the object; the text lines go to stderr now). ddp-train's steps_per_s is
// given where it was measured, at the steps whose loss it read (the first, every 20th, the last),
// not repeated over the steps read with them.
TEST(ToolAgreement, JsonStdoutIsJsonAloneWithFreshRates) {
  // { ... 2>/dev/null; }: stdout alone (run_command adds 2>&1 after the braces).
  auto [bench, bench_code] = run_command("{ " + std::string(DDP_BENCH_PATH) +
                                         " --model mlp --repeat 2 --warmup 0 --json --verbose "
                                         "--ddp --nproc 2 2>/dev/null; }");
  ASSERT_EQ(bench_code, 0) << bench;
  std::istringstream lines(bench);
  std::string line;
  int objects = 0;
  while (std::getline(lines, line)) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << "not JSON: " << line;
    ++objects;
  }
  EXPECT_EQ(objects, 1) << bench;
  auto [train, train_code] = run_command("{ " + std::string(DDP_TRAIN_PATH) +
                                         " --model mlp --steps 25 --json 2>/dev/null; }");
  ASSERT_EQ(train_code, 0) << train;
  std::istringstream train_lines(train);
  std::vector<int> rated;
  int steps = 0;
  while (std::getline(train_lines, line)) {
    const auto object = nlohmann::json::parse(line);  // throws on a line that is not JSON
    if (!object.contains("step")) continue;
    ++steps;
    if (object.contains("steps_per_s")) rated.push_back(object["step"].get<int>());
  }
  EXPECT_EQ(steps, 25) << train;
  EXPECT_EQ(rated, (std::vector<int>{1, 20, 25})) << train;
}

// --help shows a user's flags in groups: the restart tests' hooks are hidden, and the NCCL flags
// appear only in a build that has NCCL.
TEST(ToolAgreement, HelpHidesTestHooksAndFlagsTheBuildCannotUse) {
  const auto [out, code] = run_command(std::string(DDP_TRAIN_PATH) + " --help");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("--steps"), std::string::npos) << out;
  // In groups, not one flat list.
  for (const char* group :
       {"\nRun:\n", "\nModel:\n", "\nStyle:\n", "\nRecipe:\n", "\nText (--data):\n"}) {
    EXPECT_NE(out.find(group), std::string::npos) << group << out;
  }
  EXPECT_EQ(out.find("--fail-at-step"), std::string::npos) << out;
  EXPECT_EQ(out.find("--fail-rank"), std::string::npos) << out;
#if defined(DDP_WITH_NCCL) && DDP_WITH_NCCL
  EXPECT_NE(out.find("NCCL:"), std::string::npos) << out;
#else
  EXPECT_EQ(out.find("--nccl-"), std::string::npos) << out;
#endif
}

// Where libtorch sees no CUDA device (a CPU build: CI), --device cuda is refused by name before
// any worker starts, in both tools (it used to fail per rank suggesting "use backend 'gloo'").
TEST(ToolAgreement, DeviceCudaWithoutADeviceIsRefusedByName) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is here";
  for (const auto& [tool, command] : kTools) {
    const auto [out, code] = run_command(command + " --ddp --nproc 2 --device cuda");
    EXPECT_EQ(code, 2) << tool << ": " << out;
    EXPECT_EQ(out, tool +
                       ": --device cuda: libtorch sees no CUDA device here (a CPU-only build, "
                       "or no GPU); run with --device cpu\n");
  }
}

}  // namespace
