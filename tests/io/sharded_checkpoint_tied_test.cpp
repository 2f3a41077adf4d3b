// Sharded checkpoints of a model with tied parameters: the zoo GPT with wte / lm_head tied, a unit
// per block, FULLY_SHARD. Saved at world 3 after 3 steps, resumed at world 2 and at world 1 from
// other initial values, 3 more steps: the parameters equal one uninterrupted single-process run
// (rel. err < 1e-5), the tied weight is one tensor again after the load, and the full state has
// both names, as the plain model's state dict does.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/gpt.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/oracle.hpp"
#include "support/temp_dir.hpp"
#include "support/tiny_gpt.hpp"
#include "support/training_state.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kSteps = 3;        // before the checkpoint, and again after it
constexpr int64_t kGlobalBatch = 6;  // sequences; divides world 1, 2 and 3

models::GPTConfig tied_gpt() { return tiny_gpt(/*n_layers=*/2); }

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

struct Batches {
  std::vector<torch::Tensor> xs, ys;
};

Batches global_batches(const models::GPTConfig& c) {
  torch::manual_seed(1);
  Batches b;
  for (int64_t s = 0; s < 2 * kSteps; ++s) {
    b.xs.push_back(torch::randint(c.vocab_size, {kGlobalBatch, c.seq_len}));
    b.ys.push_back(torch::randint(c.vocab_size, {kGlobalBatch, c.seq_len}));
  }
  return b;
}

struct Case {
  std::string root;     // the checkpoint root
  bool resume = false;  // the resume phase (else the save phase)
  DDP_CASE_FIELDS(root, resume)
};

DDP_TEST_WORKER_WITH(sharded_checkpoint_tied, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const bool resume = c.resume;
  const auto config = tied_gpt();
  torch::manual_seed(resume ? 100 + r : 0);  // a resumed run must get every value from the files
  models::GPT gpt(config);
  shard::ShardOptions options;
  for (int64_t i = 0; i < config.n_layers; ++i) options.units.push_back("h." + std::to_string(i));
  shard::FullyShardedDataParallel<models::GPT> model(gpt, pg, options);
  torch::optim::SGD opt(distinct(gpt->parameters()), torch::optim::SGDOptions(0.1).momentum(0.9));
  io::TrainingState state = training_state(gpt.ptr().get(), &opt, model.sharding());
  io::CoordinatorOptions coordinator;
  coordinator.root = c.root;
  int64_t first = 0;
  if (resume) {
    const auto entry = io::resume_latest(*pg, coordinator, state);
    require(entry && entry->step == kSteps, "did not resume from step " + std::to_string(kSteps));
    require(gpt->lm_head->weight.is_same(gpt->wte->weight), "the load kept wte and lm_head tied");
    first = kSteps;
  }
  const Batches b = global_batches(config);
  const int64_t per_rank = kGlobalBatch / w;
  for (int64_t s = first; s < first + kSteps; ++s) {
    loss_of(model(b.xs[s].narrow(0, r * per_rank, per_rank)),
            b.ys[s].narrow(0, r * per_rank, per_rank))
        .backward();
    opt.step();
    opt.zero_grad();
  }
  if (!resume) {
    state.step = kSteps;
    io::save_and_barrier(*pg, coordinator, state);
    return;
  }
  torch::manual_seed(0);
  models::GPT oracle(config);
  torch::optim::SGD oracle_opt(distinct(oracle->parameters()),
                               torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t s = 0; s < 2 * kSteps; ++s) {
    loss_of(oracle->forward(b.xs[s]), b.ys[s]).backward();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  const io::TensorMap got = io::whole_state(*gpt, model.layouts(), pg.get());
  const io::TensorMap want = io::model_tensors(*oracle);
  require(got.size() == want.size() && got.count("lm_head.weight") == 1,
          "the full state has every name of the plain model's, lm_head.weight too");
  std::vector<std::string> names;
  std::vector<torch::Tensor> actual, expected;
  for (const auto& [name, t] : want) {
    names.push_back(name);
    actual.push_back(got.at(name));
    expected.push_back(t);
  }
  require_close(names, actual, expected, 1e-5, "tied GPT resumed at world " + std::to_string(w));
}

TEST(ShardedCheckpointTied, SavedAtThreeResumesAtTwoAndOneWithTheWeightsStillTied) {
  TempDir root("sharded_ckpt_tied");
  Case c{root.str(), false};
  auto result = run_workers(sharded_checkpoint_tied, 3, c);
  ASSERT_TRUE(result.ok()) << result.describe();
  c.resume = true;
  result = run_workers(sharded_checkpoint_tied, 2, c);
  ASSERT_TRUE(result.ok()) << result.describe();
  result = run_workers(sharded_checkpoint_tied, 1, c);
  ASSERT_TRUE(result.ok()) << result.describe();
}

}  // namespace
}  // namespace ddp::testing
