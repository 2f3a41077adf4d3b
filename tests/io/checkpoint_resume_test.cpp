// ddp-train's checkpoints end to end: a run resumed from a checkpoint ends with the parameters of
// an uninterrupted run, bit for bit, on 2 processes (Gloo).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "ddp/io/checkpoint.hpp"
#include "ddp/io/torch_save.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::TempDir;

namespace fs = std::filesystem;
using ddp::testing::run_command;

// mlp trains in well under a second per step here; 10 steps, checkpoints every 5.
std::string train(const std::string& optimizer, const std::string& flags, int nproc = 2) {
  return std::string(DDP_TRAIN_PATH) + " --nproc " + std::to_string(nproc) +
         " --model mlp --timeout-s 60 --optimizer " + optimizer + " " + flags;
}

void expect_bitwise_equal(const std::string& got_path, const std::string& want_path) {
  const auto got = ddp::io::load_weights(got_path);
  const auto want = ddp::io::load_weights(want_path);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(got.at(name), t))
        << name << " differs: max |diff| " << (got.at(name) - t).abs().max().item<double>();
  }
}

class CheckpointResume : public ::testing::TestWithParam<std::string> {};

// 10 steps straight vs 5 steps, a checkpoint, then --resume to 10: the same parameters.
TEST_P(CheckpointResume, ResumedRunEqualsUninterruptedRun) {
  TempDir dir;
  const std::string opt = GetParam();
  auto [out, code] =
      run_command(train(opt, "--steps 10 --checkpoint-every 5 --checkpoint-dir " + dir.file("a") +
                                 " --save-weights " + dir.file("a.safetensors")));
  ASSERT_EQ(code, 0) << out;
  std::tie(out, code) =
      run_command(train(opt, "--steps 5 --checkpoint-every 5 --checkpoint-dir " + dir.file("b")));
  ASSERT_EQ(code, 0) << out;
  std::tie(out, code) =
      run_command(train(opt,
                        "--steps 10 --checkpoint-every 5 --resume "
                        "--checkpoint-dir " +
                            dir.file("b") + " --save-weights " + dir.file("b.pt")));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp-train: resumed from " + dir.file("b") + "/step-5 at step 5"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" in 5 steps "), std::string::npos) << out;
  expect_bitwise_equal(dir.file("b.pt"), dir.file("a.safetensors"));
  // A resume with nothing to resume from starts fresh.
  std::tie(out, code) =
      run_command(train(opt, "--steps 2 --resume --checkpoint-dir " + dir.file("none")));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp-train: no checkpoint in " + dir.file("none") + ", starting fresh"),
            std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(CheckpointOptimizers, CheckpointResume, ::testing::Values("sgd", "adam"),
                         [](const auto& info) { return info.param; });

// FULLY_SHARD over TP at (dp 2, tp 2): the checkpoint holds whole tensors gathered by the nested
// sharding (TrainingState::sharding); 3 steps, a checkpoint, --resume to 6 ends where 6 straight
// end.
TEST(CheckpointResume, FullyShardOverTpResumesThroughItsLayouts) {
  TempDir dir;
  const std::string flags = "--steps 6 --checkpoint-every 3 --tp 2 --fsdp --model toy ";
  const auto run = [](const std::string& rest) {
    return run_command(std::string(DDP_TRAIN_PATH) + " --nproc 4 --timeout-s 60 " + rest);
  };
  auto [out, code] = run(flags + "--checkpoint-dir " + dir.file("a") + " --save-weights " +
                         dir.file("a.safetensors"));
  ASSERT_EQ(code, 0) << out;
  std::tie(out, code) =
      run("--steps 3 --checkpoint-every 3 --tp 2 --fsdp --model toy "
          "--checkpoint-dir " +
          dir.file("b"));
  ASSERT_EQ(code, 0) << out;
  std::tie(out, code) = run(flags + "--resume --checkpoint-dir " + dir.file("b") +
                            " --save-weights " + dir.file("b.safetensors"));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp-train: resumed from " + dir.file("b") + "/step-3 at step 3"),
            std::string::npos)
      << out;
  expect_bitwise_equal(dir.file("b.safetensors"), dir.file("a.safetensors"));
}

// The launcher's restart path: rank 1 dies at step 7 (exit code 3); run again with
// DDP_RESTART_COUNT=1, as a restarting launcher sets it, the run resumes from step 5 by itself
// and ends where an uninterrupted run ends.
TEST(CheckpointRestart, FailAtStepThenRestartResumesFromTheLastCheckpoint) {
  TempDir dir;
  auto [out, code] =
      run_command(train("sgd", "--steps 10 --save-weights " + dir.file("straight.safetensors")));
  ASSERT_EQ(code, 0) << out;
  const std::string flags =
      "--steps 10 --checkpoint-every 5 --fail-at-step 7 --fail-rank 1 "
      "--checkpoint-dir " +
      dir.file("c") + " --save-weights " + dir.file("restarted.safetensors");
  std::tie(out, code) = run_command(train("sgd", flags));
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("--fail-at-step 7: rank 1 exits with code 3"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 exited with code 3"), std::string::npos) << out;
  EXPECT_EQ(ddp::io::find_latest_checkpoint(dir.file("c"))->step, 5);
  std::tie(out, code) = run_command("DDP_RESTART_COUNT=1 " + train("sgd", flags));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp-train: resumed from " + dir.file("c") + "/step-5 at step 5"),
            std::string::npos)
      << out;
  expect_bitwise_equal(dir.file("restarted.safetensors"), dir.file("straight.safetensors"));
}

// The newest checkpoint corrupt: --resume warns, falls back to the older one and still ends
// bit-for-bit where the uninterrupted run ended. At another world size it resumes when the global
// batch is kept, and is refused naming the batch when it is not.
TEST(CheckpointRestart, CorruptLatestFallsBackAndAnotherWorldSizeResumes) {
  TempDir dir;
  auto [out, code] =
      run_command(train("sgd", "--steps 10 --checkpoint-every 5 --checkpoint-dir " + dir.file("d") +
                                   " --save-weights " + dir.file("straight.safetensors")));
  ASSERT_EQ(code, 0) << out;
  const std::string model = dir.file("d") + "/step-10/model.safetensors";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  std::tie(out, code) =
      run_command(train("sgd", "--steps 10 --resume --checkpoint-dir " + dir.file("d") +
                                   " --save-weights " + dir.file("resumed.safetensors")));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp: warning: skipping checkpoint " + dir.file("d") +
                     "/step-10: checkpoint " + model + " is corrupt: sha256 "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resumed from " + dir.file("d") + "/step-5 at step 5"), std::string::npos)
      << out;
  expect_bitwise_equal(dir.file("resumed.safetensors"), dir.file("straight.safetensors"));

  // A replicated checkpoint loads at any world size (as PyTorch's DDP state dicts do); the global
  // batch it records must still hold: world 3 with the saved --batch-size changes it.
  std::tie(out, code) =
      run_command(train("sgd", "--steps 10 --resume --checkpoint-dir " + dir.file("d"), 3));
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("ddp: checkpoint " + dir.file("d") +
                     "/step-5 was saved by a run of 64 samples a step, this run's is 96 "
                     "(TrainingState::global_batch): resume with the same global batch (at "
                     "another world size, scale the batch per rank)"),
            std::string::npos)
      << out;
  // World 4 with half the batch keeps the global batch: it ends where the uninterrupted world-2
  // run ended, to fp32 rounding (4 partial averages instead of 2).
  std::tie(out, code) =
      run_command(train("sgd",
                        "--steps 10 --batch-size 16 --resume --checkpoint-dir " + dir.file("d") +
                            " --save-weights " + dir.file("world4.safetensors"),
                        4));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("resumed from " + dir.file("d") + "/step-5 at step 5"), std::string::npos)
      << out;
  const auto got = ddp::io::load_weights(dir.file("world4.safetensors"));
  const auto want = ddp::io::load_weights(dir.file("straight.safetensors"));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    const double rel = (got.at(name) - t).norm().item<double>() / t.norm().item<double>();
    EXPECT_LT(rel, 1e-5) << name;
    EXPECT_GT(t.norm().item<double>(), 0) << name;
  }
}

TEST(CheckpointRestart, FlagsThatCannotBeCheckpointedAreRefused) {
  for (const std::string flag : {"--resume", "--checkpoint-async", "--checkpoint-every 5"}) {
    const auto [out, code] = run_command(std::string(DDP_TRAIN_PATH) + " " + flag + " --steps 1");
    EXPECT_NE(code, 0) << flag;
    EXPECT_NE(
        out.find("--checkpoint-every, --checkpoint-async and --resume need --checkpoint-dir DIR"),
        std::string::npos)
        << out;
  }
  std::string out;
  int code = 0;
  std::tie(out, code) = run_command(std::string(DDP_TRAIN_PATH) +
                                    " --checkpoint-dir /nonexistent --optimizer-overlap");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("cannot be combined with --optimizer-overlap"), std::string::npos) << out;
}

}  // namespace
