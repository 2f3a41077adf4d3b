// The multi-rank checkpoint protocol (checkpoint_coordinator.hpp) at world sizes 1, 2 and 3:
// every rank resumes from the same step, a corrupt newest checkpoint makes every rank fall back to
// the older one, and a rank that cannot load stops all of them.

#include "ddp/io/checkpoint_coordinator.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace {

namespace fs = std::filesystem;
using ddp::testing::require;

// Every parameter set to `value`: a checkpoint of step s holds s everywhere.
void fill(torch::nn::Module& m, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.fill_(value);
}

bool all_equal(torch::nn::Module& m, double value) {
  for (const auto& p : m.parameters()) {
    if (!at::all(p == value).item<bool>()) return false;
  }
  return true;
}

// The sum over ranks of `value`: equal to world * value when every rank holds the same.
int64_t sum_over_ranks(ddp::comm::ProcessGroup& pg, int64_t value) {
  auto t = at::full({1}, value, at::kLong);
  pg.allreduce_sum(t, "test sum");
  return t.item<int64_t>();
}

struct Case {
  std::string root;  // the checkpoint root
  DDP_CASE_FIELDS(root)
};

DDP_TEST_WORKER_WITH(coordinator_resume, Case, c) {
  auto pg = ddp::testing::worker_process_group();
  const int world = pg->world_size();
  ddp::io::CoordinatorOptions options;
  options.root = c.root;
  options.keep = 0;
  auto linear = torch::nn::Linear(3, 2);
  ddp::io::TrainingState state;
  state.model = linear.ptr().get();
  state.global_batch = 8;

  // Nothing saved yet: every rank starts fresh.
  require(!ddp::io::resume_latest(*pg, options, state).has_value(), "an empty root resumed");

  for (int step = 1; step <= 2; ++step) {
    fill(*linear, step);
    state.step = step;
    state.data_position = 10 * step;
    const std::string dir = ddp::io::save_and_barrier(*pg, options, state);
    // After the call the checkpoint is complete for every rank, not only for rank 0.
    require(fs::exists(fs::path(options.root) / ("step-" + std::to_string(step)) / "manifest.json"),
            "step " + std::to_string(step) + " not complete after save_and_barrier");
    require(dir == (pg->rank() == 0 ? ddp::io::checkpoint_dir(options.root, step) : ""),
            "save_and_barrier returned '" + dir + "'");
  }

  fill(*linear, 0);
  state.global_batch = 0;  // unstated: the load sets the checkpoint's
  auto resumed = ddp::io::resume_latest(*pg, options, state);
  require(resumed && resumed->step == 2 && state.step == 2 && state.data_position == 20 &&
              state.global_batch == 8,
          "did not resume from step 2 with its global batch");
  require(all_equal(*linear, 2), "parameters are not step 2's");
  require(sum_over_ranks(*pg, state.step) == 2 * world, "ranks resumed from different steps");

  // Rank 0 corrupts the newest checkpoint; every rank must fall back to step 1 together.
  if (pg->rank() == 0) {
    std::fstream f(fs::path(options.root) / "step-2" / "model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  pg->barrier("test corrupt barrier");
  fill(*linear, 0);
  resumed = ddp::io::resume_latest(*pg, options, state);
  require(resumed && resumed->step == 1 && state.step == 1 && state.data_position == 10,
          "did not fall back to step 1");
  require(resumed->dir == ddp::io::checkpoint_dir(options.root, 1), "wrong directory");
  require(all_equal(*linear, 1), "parameters are not step 1's");
  require(sum_over_ranks(*pg, state.step) == world, "ranks fell back to different steps");

  // A stated global batch other than the saved run's is refused by name on every rank before
  // anything changes (issue 46: such a resume passed silently unless the program checked).
  fill(*linear, 0);
  ddp::io::TrainingState other_batch = state;
  other_batch.global_batch = 6;
  std::string refused;
  try {
    ddp::io::resume_latest(*pg, options, other_batch);
  } catch (const c10::Error& e) {
    refused = e.what_without_backtrace();
  }
  require(refused == "ddp: checkpoint " + ddp::io::checkpoint_dir(options.root, 1) +
                         " was saved by a run of 8 samples a step, this run's is 6 "
                         "(TrainingState::global_batch): resume with the same global batch (at "
                         "another world size, scale the batch per rank)",
          "another global batch: " + refused);
  require(all_equal(*linear, 0) && other_batch.step == 1,
          "a refused resume changed the parameters or the step");
  fill(*linear, 1);

  // The last rank's model does not match the checkpoint: it fails with its own reason, the
  // others learn that it failed, and nobody is left waiting in a collective.
  auto other = torch::nn::Linear(5, 2);
  ddp::io::TrainingState mismatched = state;
  const bool last = pg->rank() == world - 1;
  if (last) mismatched.model = other.ptr().get();
  std::string error;
  try {
    ddp::io::resume_latest(*pg, options, mismatched);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  if (last) {
    require(error.find("weight") != std::string::npos, "the failing rank's own error: " + error);
  } else {
    require(error == "ddp: checkpoint " + ddp::io::checkpoint_dir(options.root, 1) +
                         " could not be loaded on 1 rank(s) (their errors say why)",
            "a healthy rank's error: " + error);
  }
  pg->barrier("test final barrier");
}

class CheckpointCoordinator : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointCoordinator, EveryRankResumesFromTheSameCheckpoint) {
  ddp::testing::TempDir root("coordinator");
  EXPECT_WORKERS_PASS(ddp::testing::run_workers(coordinator_resume, GetParam(), Case{root.str()}));
}

INSTANTIATE_TEST_SUITE_P(World, CheckpointCoordinator, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
