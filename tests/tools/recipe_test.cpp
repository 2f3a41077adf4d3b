// The GPT recipe in the tools (tools/common/recipe_flags.hpp): AdamW in weight-decay groups,
// warmup then cosine decay, clipping over every rank's shards, gradient accumulation.
//   - ddp-bench parity runs: --grad-accum 4 at world 2 equals one step on 4x the batch at world 2
//     and on 8x in one process (DDP and FULLY_SHARD), with the whole recipe on;
//   - ddp-train --data: a replicated checkpoint saved at world 2 resumes at world 3 on the same
//     windows and continues the schedule, ending where the uninterrupted world-2 run ends;
//   - --json lines carry the schedule's closed-form rate, the gradient norm and the MFU; the plot
//     gains the rate;
//   - bad input by exact text.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "ddp/io/safetensors.hpp"
#include "ddp/optim/lr_schedule.hpp"
#include "support/resume_runs.hpp"
#include "support/run_command.hpp"
#include "support/same_weights.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::run_command;
using ddp::testing::TempDir;

const std::string kTrain = DDP_TRAIN_PATH;
const std::string kBench = DDP_BENCH_PATH;

// The recipe's schedule and clip on mlp-deep at --lr 0.01: one warmup step, cosine to 0.001 by
// step 3, clip at 0.5 (below the initial norm, so clipping acts), with ddp-bench's SGD. [Note:
// Adam in equivalence tests]
//
// [Note: Adam in equivalence tests] Runs that are equal in exact arithmetic (accumulation or not,
// world 2 or 3) sum in another order, so a few gradient elements differ in the last bit; Adam
// divides each element by its own magnitude, and where a gradient is near zero a last-bit
// difference becomes an update of up to lr (measured: 1e-5 to 7e-5 relative after 3 AdamW steps,
// against 1e-8 with SGD). So equivalence is asserted with SGD (the gradients are what accumulation
// and resharding must get right), and AdamW where the arithmetic is the same: its state round trip
// at one world size, and PyTorch's DDP (Bench.RecipeParityWithPyTorch), both bit for bit.
const std::string kRecipe =
    " --lr 0.01 --warmup-steps 1 --lr-decay-steps 3 --min-lr 0.001 --grad-clip 0.5 ";

// Writes 3 steps of inputs for `data_ranks` ranks of `per_rank` samples each, and the same
// samples whole for one process; returns {ranks' file, whole file}.
std::pair<std::string, std::string> write_inputs(const TempDir& dir, int data_ranks,
                                                 int64_t per_rank) {
  torch::manual_seed(3);
  ddp::io::TensorMap inputs, whole;
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({per_rank * data_ranks, 512});
    const auto y = torch::randn({per_rank * data_ranks, 512});
    for (int r = 0; r < data_ranks; ++r) {
      const std::string key = std::to_string(step) + "." + std::to_string(r);
      inputs["x." + key] = x.narrow(0, per_rank * r, per_rank);
      inputs["y." + key] = y.narrow(0, per_rank * r, per_rank);
    }
    whole["x." + std::to_string(step) + ".0"] = x;
    whole["y." + std::to_string(step) + ".0"] = y;
  }
  const std::string ranks = dir.file("inputs.safetensors");
  const std::string all = dir.file("whole.safetensors");
  ddp::io::save_safetensors(ranks, inputs);
  ddp::io::save_safetensors(all, whole);
  return {ranks, all};
}

void bench(const std::string& flags, const std::string& inputs, const std::string& out) {
  const auto [text, code] = run_command(kBench + " --model mlp-deep" + kRecipe + flags +
                                        " --inputs " + inputs + " --save-params " + out);
  ASSERT_EQ(code, 0) << flags << "\n" << text;
}

// `style` at world 2 with --grad-accum 4 (micro-batches of 1), the same without accumulation, and
// one process on the whole batch: three ways to take the same 3 steps.
void expect_accumulation_is_the_big_batch(const std::string& style) {
  const TempDir dir("recipe_accum");
  const auto [ranks, whole] = write_inputs(dir, 2, 4);
  bench(" " + style + " --nproc 2 --grad-accum 4", ranks, dir.file("accum.safetensors"));
  bench(" " + style + " --nproc 2", ranks, dir.file("big.safetensors"));
  bench("", whole, dir.file("single.safetensors"));
  ddp::testing::expect_same_weights(dir.file("single.safetensors"), dir.file("accum.safetensors"),
                                    style + " --grad-accum 4 vs one process: ");
  ddp::testing::expect_same_weights(dir.file("single.safetensors"), dir.file("big.safetensors"),
                                    style + " 4x the batch vs one process: ");
}

TEST(RecipeBench, GradAccumFourAtWorldTwoIsOneStepOnFourTimesTheBatchDdp) {
  expect_accumulation_is_the_big_batch("--ddp");
}

TEST(RecipeBench, GradAccumFourAtWorldTwoIsOneStepOnFourTimesTheBatchFullyShard) {
  expect_accumulation_is_the_big_batch("--fsdp --fsdp-wrap");
}

TEST(RecipeBench, AnUnevenAccumulationIsNamed) {
  const TempDir dir("recipe_uneven");
  const auto [ranks, whole] = write_inputs(dir, 1, 4);
  const auto [text, code] =
      run_command(kBench + " --model mlp-deep --grad-accum 3 --inputs " + whole);
  EXPECT_NE(code, 0);
  EXPECT_NE(text.find("ddp-bench: a batch of 4 samples cannot be split into --grad-accum 3 equal "
                      "micro-batches"),
            std::string::npos)
      << text;
}

// ---- ddp-train ----

auto train(const std::string& flags) { return run_command(kTrain + " " + flags); }

// Every "{...}" line of a --json run with `key`, as key -> number maps.
std::vector<std::map<std::string, double>> json_lines(const std::string& out,
                                                      const std::string& key) {
  std::vector<std::map<std::string, double>> lines;
  size_t pos = 0;
  while ((pos = out.find("{\"step\":", pos)) != std::string::npos) {
    const size_t end = out.find('}', pos);
    const std::string line = out.substr(pos + 1, end - pos - 1);
    std::map<std::string, double> fields;
    size_t i = 0;
    while (i < line.size()) {
      const size_t colon = line.find(':', i);
      const std::string name = line.substr(i + 1, colon - i - 2);
      const size_t comma = line.find(',', colon);
      fields[name] = std::stod(line.substr(colon + 1, comma - colon - 1));
      i = comma == std::string::npos ? line.size() : comma + 1;
    }
    if (fields.count(key) > 0) lines.push_back(fields);
    pos = end;
  }
  return lines;
}

TEST(RecipeTrain, JsonLinesCarryTheScheduleTheGradNormAndMfu) {
  const auto [out, code] = train(
      "--data --nproc 2 --batch-size 4 --steps 6 --eval-every 3 --sample-bytes 0 --json "
      "--optimizer adamw --lr 0.01 --warmup-steps 2 --lr-decay-steps 6 --min-lr 0.001 "
      "--grad-clip 1 --grad-accum 2 --peak-tflops 1");
  ASSERT_EQ(code, 0) << out;
  const auto steps = json_lines(out, "loss");
  ASSERT_EQ(steps.size(), 6u) << out;
  ddp::optim::LrScheduleOptions schedule;
  schedule.lr = 0.01;
  schedule.min_lr = 0.001;
  schedule.warmup_steps = 2;
  schedule.decay_steps = 6;
  double flops_per_token = 0;
  std::vector<int> rated;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    EXPECT_EQ(s.at("step"), double(i + 1));
    EXPECT_NEAR(s.at("lr"), ddp::optim::lr_at(schedule, int64_t(i)), 1e-9) << "step " << i + 1;
    EXPECT_GT(s.at("grad_norm"), 0) << "step " << i + 1;
    // The rates where they were measured: the steps whose loss was read (the first, each
    // evaluation's, the last), not repeated over the steps read with them.
    if (s.count("steps_per_s") == 0) {
      EXPECT_EQ(s.count("tok_per_s") + s.count("mfu"), 0u) << "step " << i + 1;
      continue;
    }
    rated.push_back(static_cast<int>(i + 1));
    // MFU = FLOPs per token x tokens/s / (2 ranks x 1e12): the same FLOPs per token every line.
    const double per_token = s.at("mfu") * 2e12 / s.at("tok_per_s");
    if (flops_per_token == 0) flops_per_token = per_token;
    EXPECT_NEAR(per_token, flops_per_token, 1e-6 * flops_per_token);
  }
  EXPECT_EQ(rated, (std::vector<int>{1, 3, 6})) << out;
  // gpt (d_model 64, 2 layers, seq_len 32, vocab 256; 134,912 parameters): 6 N + 12 L d T with
  // N = 132,864 parameters without wpe's 32 x 64.
  EXPECT_NEAR(flops_per_token, 6.0 * 132864 + 12.0 * 2 * 64 * 32, 1.0);
  const auto validation = json_lines(out, "val_loss");
  ASSERT_EQ(validation.size(), 2u) << out;
  EXPECT_EQ(validation[1].at("step"), 6);
}

// Item 6 with the recipe: DDP with warmup-cosine, clipping and 2 micro-batches (SGD with momentum:
// [Note: Adam in equivalence tests]) saved at world 2 after 4 steps (global batch 2 x 3 x 2 = 12
// windows) resumes at world 3 (2 x 2 x 3 = 12) on the same windows and the same schedule, and ends
// where the uninterrupted world-2 run ends.
TEST(RecipeTrain, ReplicatedCheckpointResumesAtAnotherWorldSizeOnTheSameScheduleAndWindows) {
  const TempDir tmp("recipe_resume");
  const std::string dir = tmp.str();
  const std::string recipe =
      "--data --eval-every 100 --sample-bytes 0 --timeout-s 60 --optimizer sgd --lr 0.05 "
      "--warmup-steps 2 --lr-decay-steps 8 --grad-clip 1 --grad-accum 2 ";
  ddp::testing::expect_resume(
      train,
      {recipe + "--nproc 2 --batch-size 3 --steps 4", recipe + "--nproc 3 --batch-size 2 --steps 8",
       recipe + "--nproc 2 --batch-size 3 --steps 8", 4},
      dir);
}

// AdamW's two groups, its state and the schedule's position through a checkpoint: resumed at step
// 3 of 6 (same world size), the run is bit for bit the uninterrupted one. A run with another
// optimizer cannot take that state and says so.
TEST(RecipeTrain, AdamWGroupsAndScheduleSurviveACheckpointBitForBit) {
  const TempDir tmp("recipe_adamw");
  const std::string dir = tmp.str();
  const std::string recipe =
      "--data --nproc 2 --batch-size 3 --eval-every 100 --sample-bytes 0 --timeout-s 60 "
      "--optimizer adamw --weight-decay 0.1 --beta2 0.95 --lr 0.005 --warmup-steps 2 "
      "--lr-decay-steps 6 --grad-clip 1 --grad-accum 2 ";
  const auto [a_out, a_code] =
      train(recipe + "--steps 3 --checkpoint-dir " + dir + "/ckpt --checkpoint-every 3");
  ASSERT_EQ(a_code, 0) << a_out;
  const auto [b_out, b_code] =
      train(recipe + "--steps 6 --checkpoint-dir " + dir + "/ckpt --resume --save-weights " + dir +
            "/resumed.safetensors");
  ASSERT_EQ(b_code, 0) << b_out;
  EXPECT_NE(b_out.find("at step 3"), std::string::npos) << b_out;
  const auto [c_out, c_code] =
      train(recipe + "--steps 6 --save-weights " + dir + "/straight.safetensors");
  ASSERT_EQ(c_code, 0) << c_out;
  const auto a = ddp::io::load_safetensors(dir + "/straight.safetensors");
  const auto b = ddp::io::load_safetensors(dir + "/resumed.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  const auto [d_out, d_code] = train(
      "--data --nproc 2 --batch-size 3 --grad-accum 2 --steps 6 --optimizer sgd "
      "--timeout-s 60 --checkpoint-dir " +
      dir + "/ckpt --resume");
  EXPECT_NE(d_code, 0);
  EXPECT_NE(d_out.find("ddp: checkpoint " + dir +
                       "/ckpt/step-3 holds the state of a adamw "
                       "optimizer but this run uses sgd"),
            std::string::npos)
      << d_out;
}

TEST(RecipeTrain, PlotGainsTheLearningRate) {
  const TempDir tmp("recipe_plot");
  const std::string svg = tmp.file("loss.svg");
  const auto [out, code] = train(
      "--data --nproc 1 --batch-size 2 --steps 5 --eval-every 5 --sample-bytes 0 "
      "--optimizer adamw --warmup-steps 2 --lr-decay-steps 5 --plot " +
      svg);
  ASSERT_EQ(code, 0) << out;
  const std::string text = ddp::testing::read_file(svg);
  EXPECT_NE(text.find("<polyline class=\"lr\""), std::string::npos);
  EXPECT_NE(text.find(">learning rate</text>"), std::string::npos);
}

TEST(RecipeTrain, BadInputIsRefusedByExactText) {
  const std::pair<std::string, std::string> cases[] = {
      {"--grad-clip 0",
       "ddp-train: --grad-clip must be a positive number (the largest total gradient norm), got 0"},
      {"--grad-clip -1",
       "ddp-train: --grad-clip must be a positive number (the largest total gradient norm), got "
       "-1"},
      {"--warmup-steps 10 --lr-decay-steps 5",
       "ddp-train: --warmup-steps (10) must not exceed --lr-decay-steps (5): the decay would end "
       "before the warmup"},
      {"--lr-decay linear",
       "ddp-train: a linear decay needs --lr-decay-steps (the step at which it "
       "reaches --min-lr)"},
      {"--optimizer lamb", "--optimizer: lamb not in {sgd,adam,adamw}"},
      {"--weight-decay 0.1",
       "ddp-train: --weight-decay needs --optimizer adamw, got --optimizer sgd"},
      {"--grad-skip-nonfinite",
       "ddp-train: --grad-skip-nonfinite needs --grad-clip (the clip computes the gradient norm)"},
      {"--grad-clip 1 --optimizer-overlap",
       "ddp-train: --grad-clip cannot be combined with --optimizer-overlap: the optimizer steps "
       "inside backward, before the norm of the whole gradient is known"},
      {"--model mlp --n-layer 3",
       "ddp-train: --n-layer, --n-head, --seq-len and --dropout need a GPT or Llama model, got "
       "--model mlp"},
      {"--model gpt --tp 2 --dropout 0.1",
       "ddp-train: --dropout cannot be combined with --tp: the ranks of a tp group would drop "
       "different elements of the activations they must share"},
  };
  for (const auto& [flags, text] : cases) {
    const auto [out, code] = train(flags);
    EXPECT_NE(code, 0) << flags << "\n" << out;
    EXPECT_NE(out.find(text), std::string::npos) << flags << "\n" << out;
  }
}

}  // namespace
