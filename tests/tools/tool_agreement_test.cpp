// ddp-bench and ddp-train agree on how a style is chosen (issue 46): the same flags (--style, and
// its short forms --ddp and --fsdp), the same refusal of two that disagree, before any worker
// starts; both refuse --nproc under another launcher by name; ddp-train --json's stdout under
// --nproc parses as JSON lines.

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "support/run_command.hpp"

namespace {

using ddp::testing::run_command;

const std::vector<std::pair<std::string, std::string>> kTools = {
    {"ddp-bench", std::string(DDP_BENCH_PATH) + " --model toy --repeat 1 --warmup 0"},
    {"ddp-train", std::string(DDP_TRAIN_PATH) + " --model net --steps 1"}};

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
  // ddp-train's header names DDP's buckets (a sharded style names its units instead).
  const auto [out, code] =
      run_command(kTools[1].second + " --nproc 2 --timeout-s 60 --style replicate");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(" buckets, world size 2,"), std::string::npos) << out;
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
                       ": --nproc 2 under a launcher (torchrun's rank variables are set): the "
                       "launcher starts the ranks, so each of its processes would start a "
                       "separate world of 2; drop --nproc\n")
        << tool;
  }
}

TEST(ToolAgreement, DdpTrainJsonStdoutParsesLineByLineUnderNproc) {
  const auto [out, code] = run_command(
      std::string(DDP_TRAIN_PATH) +
      " --nproc 2 --model net --steps 3 --json --timeout-s 60 2>/dev/null | /usr/bin/python3 -c "
      "'import json, sys; lines = [json.loads(l) for l in sys.stdin]; "
      "assert [l[\"step\"] for l in lines] == [1, 2, 3], lines; print(\"parsed\", len(lines))'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, "parsed 3\n");
}

}  // namespace
