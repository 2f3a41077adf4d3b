#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include <unistd.h>

#include <torch/torch.h>

#include "ddp/io/checkpoint.hpp"
#include "ddp/io/checkpoint_manifest.hpp"
#include "ddp/io/torch_save.hpp"
#include "ddp/launch/spawn.hpp"
#include "support/pytorch_required.hpp"
#include "support/resume_runs.hpp"
#include "support/run_command.hpp"
#include "support/same_weights.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::expect_same_weights;
using ddp::testing::run_command;
auto run(const std::string& command) { return run_command(command); }

// --flight-recorder: a rank that crashes at step 5 leaves the others' dumps (each written when
// its collective failed or when the launcher stopped it), and the launcher says where they are.
// Every surviving rank's newest collective is of step 5 and never completed.
TEST(DdpTrain, AFailedJobLeavesTheOtherRanksFlightDumpsAndSaysWhere) {
  ddp::testing::TempDir dir;
  const std::string fr = dir.file("fr");
  const auto [out, code] =
      run(std::string(DDP_TRAIN_PATH) +
          " --nproc 3 --model mlp --steps 20 --timeout-s 20 --fail-at-step 5 --fail-rank 1 "
          "--flight-recorder " +
          fr + " 2>&1");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("flight recorder dumps in " + fr + " (ddp-forensics " + fr +
                     " names the first divergence)"),
            std::string::npos)
      << out;
  for (int rank : {0, 2}) {
    std::ifstream in(fr + "/flight-rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(in.good()) << "no dump of rank " << rank << "\n" << out;
    std::stringstream text;
    text << in.rdbuf();
    const auto dump = nlohmann::json::parse(text.str());
    EXPECT_EQ(dump.at("rank"), rank);
    const auto& entries = dump.at("groups").at(0).at("entries");
    ASSERT_FALSE(entries.empty());
    EXPECT_EQ(entries.back().at("step"), 5) << entries.back().dump();
    EXPECT_NE(entries.back().at("state"), "completed") << entries.back().dump();
  }
  EXPECT_FALSE(std::ifstream(fr + "/flight-rank1.json").good()) << "the crashed rank dumped";
}

// The acceptance line of the foundation issue: the seed Net's 3-bucket table, then training.
TEST(DdpTrain, SeedNetPrintsThreeBucketsAndTrains) {
  const auto [out, code] = run(std::string(DDP_TRAIN_PATH) +
                               " --nproc 2 --model net --verbose --steps 5 --timeout-s 60");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DDP bucket assignment (3 buckets)"), std::string::npos) << out;
  EXPECT_NE(out.find("|     0 | 16008000 | fc4.bias    |"), std::string::npos) << out;
  EXPECT_NE(out.find("|     1 | 32016000 | fc3.bias    |"), std::string::npos) << out;
  EXPECT_NE(out.find("|     2 | 16008000 | fc1.bias    |"), std::string::npos) << out;
  EXPECT_NE(out.find("world size 2, backend gloo"), std::string::npos) << out;
  EXPECT_NE(out.find("ddp-train: loss "), std::string::npos) << out;
}

TEST(DdpTrain, LossFallsOnTheSyntheticTask) {
  const auto [out, code] =
      run(std::string(DDP_TRAIN_PATH) + " --nproc 3 --model mlp --steps 60 --timeout-s 60");
  ASSERT_EQ(code, 0) << out;
  const auto losses = ddp::testing::train_losses(out);
  ASSERT_TRUE(losses) << out;
  EXPECT_LT(losses->second, 0.7 * losses->first) << out;
}

// The reducer options as flags: every one is accepted, reaches the run, and training still learns.
TEST(DdpTrain, ReducerFlagsReachTheRun) {
  const auto [out, code] = run(std::string(DDP_TRAIN_PATH) +
                               " --nproc 2 --model mlp --steps 60 --timeout-s 60 --comm-hook "
                               "powersgd --optimizer-overlap --no-graph-planning --static-graph "
                               "--find-unused-parameters --stats-every 5 --verbose");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("hook powersgd"), std::string::npos) << out;
  EXPECT_NE(out.find("DDP runtime stats"), std::string::npos) << out;
  EXPECT_NE(out.find("60 iterations, 20 sampled"), std::string::npos) << out;  // 1-10, 15, ..., 60
  const auto losses = ddp::testing::train_losses(out);
  ASSERT_TRUE(losses) << out;
  EXPECT_LT(losses->second, 0.8 * losses->first) << out;
}

// The sharded styles train the same model as DDP: 20 steps of SGD with momentum on the GPT at
// world 3 (uneven rows), per-block units with resharding and prefetch, end with the weights DDP
// ends with (the full weights are gathered for --save-weights). Not Adam here: the GPT's key-bias
// gradient is zero in exact arithmetic, and Adam turns its rounding noise into full steps
// (tests/shard/unit_schedule_test.cpp tests Adam on the MLP).
TEST(DdpTrain, ShardedStylesEndWhereDdpEnds) {
  const ddp::testing::TempDir tmp("train_styles");
  const std::string dir = tmp.str();
  const std::string common = std::string(DDP_TRAIN_PATH) +
                             " --nproc 3 --model gpt --steps 20 --batch-size 4 --optimizer sgd "
                             "--timeout-s 60 --save-weights ";
  const auto [ddp_out, ddp_code] = run(common + dir + "/ddp.safetensors");
  ASSERT_EQ(ddp_code, 0) << ddp_out;
  for (const std::string style : {"--fsdp --fsdp-wrap --verbose", "--style default"}) {
    const auto [out, code] = run(common + dir + "/sharded.safetensors " + style);
    ASSERT_EQ(code, 0) << out;
    if (style.find("verbose") != std::string::npos) {
      EXPECT_NE(out.find("3 units (fully_shard)"), std::string::npos) << out;
      EXPECT_NE(out.find("| h.0    | h.0.ln_1.weight"), std::string::npos) << out;
    }
    expect_same_weights(dir + "/ddp.safetensors", dir + "/sharded.safetensors", style + ": ");
  }
}

// --dp-replicate 2 at world 4 (hybrid sharding: 2 replicas of 2 shards, per-block units) ends
// with the weights of DDP at world 4 on the same samples; --dp-replicate nodes on one node is
// flat; a replica count that does not divide the world (or its data-parallel ranks under --tp) is
// refused by name.
TEST(DdpTrain, HybridShardingEndsWhereDdpEnds) {
  const ddp::testing::TempDir tmp("train_hybrid");
  const std::string dir = tmp.str();
  const std::string common = std::string(DDP_TRAIN_PATH) +
                             " --nproc 4 --model gpt --steps 10 --batch-size 3 --optimizer sgd "
                             "--timeout-s 60 --save-weights ";
  const auto [ddp_out, ddp_code] = run(common + dir + "/ddp.safetensors");
  ASSERT_EQ(ddp_code, 0) << ddp_out;
  const auto [out, code] =
      run(common + dir + "/hybrid.safetensors --fsdp --fsdp-wrap --dp-replicate 2");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("3 units (fully_shard, hybrid: 2 replicas of 2 shards), world size 4"),
            std::string::npos)
      << out;
  expect_same_weights(dir + "/ddp.safetensors", dir + "/hybrid.safetensors", "hybrid: ");
  const auto [odd, odd_code] =
      run(std::string(DDP_TRAIN_PATH) + " --nproc 4 --model mlp --steps 1 --fsdp --dp-replicate 3");
  EXPECT_NE(odd_code, 0);
  EXPECT_NE(odd.find("[rank 0] ddp-train: --dp-replicate 3 does not divide the world size 4"),
            std::string::npos)
      << odd;
  // One node (ddp-train --nproc: LOCAL_WORLD_SIZE 4): "nodes" is one replica, flat.
  const auto [nodes, nodes_code] = run(std::string(DDP_TRAIN_PATH) +
                                       " --nproc 4 --model gpt --steps 1 --fsdp --fsdp-wrap "
                                       "--dp-replicate nodes");
  ASSERT_EQ(nodes_code, 0) << nodes;
  EXPECT_NE(nodes.find("3 units (fully_shard), world size 4"), std::string::npos) << nodes;
  const auto [tp, tp_code] = run(std::string(DDP_TRAIN_PATH) +
                                 " --nproc 4 --model net --steps 1 --fsdp --dp-replicate 4 --tp 2");
  EXPECT_NE(tp_code, 0);
  EXPECT_NE(tp.find("ddp-train: --dp-replicate 4 does not divide the 2 data-parallel ranks "
                    "(world / --tp)"),
            std::string::npos)
      << tp;
}

// --tp 2 at world 4 (the seed plan over "tp", DDP over "dp", 2 data ranks) ends with the weights of
// a plain DDP run at world 2 on the same samples; so does hybrid FULLY_SHARD over --tp 2.
TEST(DdpTrain, TensorParallelEndsWhereDdpEnds) {
  const ddp::testing::TempDir tmp("train_tp");
  const std::string dir = tmp.str();
  const std::string common = std::string(DDP_TRAIN_PATH) +
                             " --model net --dim 64 --steps 10 --batch-size 4 --optimizer sgd "
                             "--timeout-s 60 --save-weights ";
  const auto [ddp_out, ddp_code] = run(common + dir + "/ddp.safetensors --nproc 2");
  ASSERT_EQ(ddp_code, 0) << ddp_out;
  const auto [tp_out, tp_code] = run(common + dir + "/tp.safetensors --nproc 4 --tp 2 --verbose");
  ASSERT_EQ(tp_code, 0) << tp_out;
  // --verbose: the split next to the bucket table (whose sizes are the local shards').
  EXPECT_NE(tp_out.find("| fc1.weight | ColwiseParallel | [64, 64]    | [32, 64]    |"),
            std::string::npos)
      << tp_out;
  EXPECT_NE(tp_out.find("| fc2.weight | RowwiseParallel | [64, 64]    | [64, 32]    |"),
            std::string::npos)
      << tp_out;
  expect_same_weights(dir + "/ddp.safetensors", dir + "/tp.safetensors");
  // Hybrid sharding beside --tp: the 3-D mesh (2 replicas, 1 shard, tp 2), the same weights.
  const auto [hybrid_out, hybrid_code] =
      run(common + dir + "/hybrid.safetensors --nproc 4 --tp 2 --fsdp --dp-replicate 2");
  ASSERT_EQ(hybrid_code, 0) << hybrid_out;
  EXPECT_NE(hybrid_out.find("hybrid: 2 replicas of 1 shard"), std::string::npos) << hybrid_out;
  expect_same_weights(dir + "/ddp.safetensors", dir + "/hybrid.safetensors", "hybrid x tp: ");
  // A sharded style over "dp" with --tp checkpoints through its nested layouts (whole tensors;
  // CheckpointResume.FullyShardOverTpResumesThroughItsLayouts resumes one), and its weights are
  // written whole.
  const auto [ckpt_out, ckpt_code] = run(common + dir + "/x.safetensors --nproc 2 --tp 2 --fsdp " +
                                         "--checkpoint-every 5 --checkpoint-dir " + dir + "/ckpt");
  ASSERT_EQ(ckpt_code, 0) << ckpt_out;
  EXPECT_EQ(ddp::io::load_weights(dir + "/x.safetensors").at("fc1.weight").sizes(),
            (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(ddp::io::verify_checkpoint(dir + "/ckpt/step-10").step, 10);
}

// Checkpoints of tensor-parallel runs hold whole tensors: saved on one mesh, resumed on another
// (the global batch kept), the run ends with the weights of an uninterrupted one. The seed plan
// with Adam, saved at 2x2 and resumed at 1x2; the GPT plan (q, k, v packed) with SGD momentum,
// saved at 1x2 and resumed at 2x2. (Not the GPT with Adam: the key bias's true gradient is 0, and
// Adam scales the rounding noise of a changed reduction order up to full steps, 1e-4 apart.)
struct MeshResume {
  const char* flags;           // model and optimizer
  int save_nproc, save_batch;  // --tp 2 throughout
  int resume_nproc, resume_batch;
};
class TensorParallelCheckpoint : public ::testing::TestWithParam<MeshResume> {};

TEST_P(TensorParallelCheckpoint, ResumesOnAnotherMeshWhereTheUninterruptedRunEnds) {
  const MeshResume c = GetParam();
  const ddp::testing::TempDir tmp("train_tp_ckpt");
  const std::string dir = tmp.str();
  const std::string train = std::string(DDP_TRAIN_PATH) + " " + c.flags +
                            " --tp 2 --timeout-s 60 --checkpoint-dir " + dir + "/ckpt ";
  const auto n = [](int v) { return std::to_string(v); };
  const auto [a_out, a_code] = run(train + "--nproc " + n(c.save_nproc) + " --batch-size " +
                                   n(c.save_batch) + " --steps 4 --checkpoint-every 4");
  ASSERT_EQ(a_code, 0) << a_out;
  const auto [b_out, b_code] =
      run(train + "--nproc " + n(c.resume_nproc) + " --batch-size " + n(c.resume_batch) +
          " --steps 8 --resume --save-weights " + dir + "/resumed.safetensors");
  ASSERT_EQ(b_code, 0) << b_out;
  EXPECT_NE(b_out.find("resumed from"), std::string::npos) << b_out;
  EXPECT_NE(b_out.find("at step 4"), std::string::npos) << b_out;
  const auto [c_out, c_code] =
      run(std::string(DDP_TRAIN_PATH) + " " + c.flags + " --tp 2 --timeout-s 60 --nproc " +
          n(c.save_nproc) + " --batch-size " + n(c.save_batch) + " --steps 8 --save-weights " +
          dir + "/whole.safetensors");
  ASSERT_EQ(c_code, 0) << c_out;
  expect_same_weights(dir + "/whole.safetensors", dir + "/resumed.safetensors");
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TensorParallelCheckpoint,
    ::testing::Values(MeshResume{"--model net --dim 64 --optimizer adam", 4, 4, 2, 8},
                      MeshResume{"--model gpt-tiny --optimizer sgd", 2, 4, 4, 2}),
    [](const auto& info) {
      return info.index == 0 ? std::string("SeedNetAdamSavedAt2x2ResumedAt1x2")
                             : std::string("GptSgdSavedAt1x2ResumedAt2x2");
    });

// A FULLY_SHARD run saved at world 3 resumes at world 2 (the global batch kept at 12 samples) and
// ends with the weights of an uninterrupted DDP run over the same 16 global batches.
TEST(DdpTrain, ShardedCheckpointSavedAtThreeResumesAtTwo) {
  const ddp::testing::TempDir tmp("train_sharded_ckpt");
  const std::string dir = tmp.str();
  const std::string train = std::string(DDP_TRAIN_PATH) + " --model mlp --timeout-s 60 ";
  ddp::testing::expect_resume(run,
                              {train + "--nproc 3 --batch-size 4 --steps 8 --fsdp --fsdp-wrap",
                               train + "--nproc 2 --batch-size 6 --steps 16 --fsdp --fsdp-wrap",
                               train + "--nproc 2 --batch-size 6 --steps 16", 8},
                              dir);
}

TEST(DdpTrain, BadFlagIsRefusedWithItsName) {
  const auto [out, code] = run(std::string(DDP_TRAIN_PATH) + " --model nope");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--model: nope not in"), std::string::npos) << out;
}

// --tie-weights reaches the model: the gpt workload's lm_head shares wte's vocab 256 x d_model 64
// weight, 16384 parameters fewer, and trains (one step, DDP at world 2).
TEST(DdpTrain, TieWeightsSharesTheEmbeddingWithTheOutputLayer) {
  const auto parameters = [](const std::string& flags) -> long long {
    const auto [out, code] = run(std::string(DDP_TRAIN_PATH) +
                                 " --nproc 2 --model gpt --steps 1 --timeout-s 60 " + flags);
    EXPECT_EQ(code, 0) << out;
    long long n = -1;
    const auto at = out.find("ddp-train: model gpt, ");
    EXPECT_NE(at, std::string::npos) << out;
    if (at != std::string::npos) std::sscanf(out.c_str() + at, "ddp-train: model gpt, %lld", &n);
    return n;
  };
  const long long untied = parameters("");
  EXPECT_GT(untied, 0);
  EXPECT_EQ(parameters("--tie-weights"), untied - 256 * 64);
}

TEST(DdpTrain, TieWeightsNeedsAGptModel) {
  const auto [out, code] = run(std::string(DDP_TRAIN_PATH) + " --model net --tie-weights");
  EXPECT_EQ(code, 2);
  EXPECT_NE(
      out.find("ddp-train: --tie-weights needs a GPT model (gpt, gpt-tiny, gpt2-small, "
               "gpt2-medium, gpt-char), got --model net, which has no token embedding to tie"),
      std::string::npos)
      << out;
}

// --cuda-graph: refused on the CPU, and with the flags a captured step does not carry yet, before
// any worker starts. The recipe (adamw, clip, accumulation, bf16, schedules) and checkpoints are
// captured (tests/graphs, scripts/gpu-check.sh capture35).
TEST(DdpTrain, CudaGraphRefusals) {
  const std::string train = std::string(DDP_TRAIN_PATH) + " --cuda-graph ";
  const std::pair<std::string, std::string> cases[] = {
      {"",
       "ddp-train: --cuda-graph needs --device cuda, not --device cpu: CUDA graphs capture GPU "
       "work only"},
      {"--device cuda --optimizer-overlap",
       "ddp-train: --cuda-graph cannot be combined with --optimizer-overlap (torch::optim inside "
       "backward bakes its learning rate into the graph)"},
      {"--device cuda --model gpt --tp 2",
       "ddp-train: --cuda-graph cannot be combined with --tp (its collectives inside forward and "
       "backward are not captured yet)"},
      {"--device cuda --find-unused-parameters",
       "ddp-train: --cuda-graph cannot be combined with --find-unused-parameters without "
       "--static-graph (the used-parameter map is read on the host every step)"},
      {"--device cuda --backend gloo",
       "ddp-train: --cuda-graph needs the nccl backend, not gloo: Gloo's collectives run on the "
       "host, outside any CUDA graph"},
  };
  for (const auto& [flags, want] : cases) {
    const auto [out, code] = run(train + flags);
    EXPECT_EQ(code, 2) << flags;
    EXPECT_NE(out.find(want), std::string::npos) << flags << ": " << out;
  }
}

TEST(DdpTrain, MissingLauncherVariableIsNamed) {
  // Under a launcher (RANK set) but without MASTER_PORT: the error names the variable.
  const auto [out, code] = run("env -u MASTER_PORT RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 " +
                               std::string(DDP_TRAIN_PATH) + " --steps 1");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("environment variable MASTER_PORT is not set"), std::string::npos) << out;
}

// An external launcher: torchrun (Debian's python3-torch) sets the environment, ddp-train runs as
// one worker per process. Needs torchrun (see support/pytorch_required.hpp).
TEST(DdpTrain, RunsUnderTorchrunNoPython) {
  DDP_REQUIRE_PYTORCH(::access("/usr/bin/torchrun", X_OK) == 0,
                      "torchrun is not installed (python3-torch)");
  const std::string port = std::to_string(ddp::launch::find_free_port());
  const auto [out, code] =
      // -r 1 -t 1: Debian's torchrun 1.13 on Python 3.11 fails to parse the default "0" for
      // --redirects/--tee (IntFlag iteration skips NONE); tee-ing stdout sidesteps that.
      run("/usr/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port " + port +
          " -r 1 -t 1 --no_python " + std::string(DDP_TRAIN_PATH) +
          " --model mlp --steps 5 --timeout-s 60");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("world size 2, backend gloo"), std::string::npos) << out;
  EXPECT_NE(out.find("ddp-train: loss "), std::string::npos) << out;
}

// An error from tools/common (which names the tool) reaches the terminal with one prefix.
TEST(DdpTrain, ToolErrorsCarryOnePrefix) {
  const auto [out, code] =
      run(std::string(DDP_TRAIN_PATH) + " --nproc 4 --tp 3 --model net --steps 1 --timeout-s 60");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("ddp-train: --tp 3 does not divide the world size 4"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("ddp-train: ddp-train:"), std::string::npos) << out;
}

}  // namespace
