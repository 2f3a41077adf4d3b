#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/hooks/default_hooks.hpp"
#include "ddp/hooks/powersgd_hook.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using Model = parallel::DistributedDataParallel<torch::nn::AnyModule>;

// One backward of "net"(32) on this rank's shard with `hook` (null: built-in); the gradients.
std::vector<torch::Tensor> grads_with(comm::ProcessGroupPtr pg, hooks::CommHookPtr hook) {
  auto w = models::make_workload("net", {32});
  parallel::DDPOptions options;
  options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
      buckets::mib_bytes(0.002);  // several buckets
  Model model(w.module, pg, options);
  if (hook) model.register_comm_hook(hook);
  auto [x, y] = w.batch(pg->rank() * 4, 4);
  w.loss(model(x), y).backward();
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
  return out;
}

double max_rel(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).norm().item<double>() / b[i].norm().item<double>());
  }
  return worst;
}

// A user hook: sum instead of average.
class SumHook : public hooks::CommHook {
 public:
  explicit SumHook(comm::ProcessGroupPtr pg) : pg_(std::move(pg)) {}
  c10::intrusive_ptr<c10::ivalue::Future> run(hooks::GradBucket& bucket) override {
    pg_->allreduce_sum(bucket.buffer, "sum hook");
    ++calls;
    return hooks::completed_future(bucket.buffer);
  }
  std::string name() const override { return "sum"; }
  int calls = 0;

 private:
  comm::ProcessGroupPtr pg_;
};

DDP_TEST_WORKER(builtin_hooks) {
  auto pg = worker_process_group();
  const auto reference = grads_with(pg, nullptr);
  const double fp16 = max_rel(grads_with(pg, hooks::fp16_compress_hook(pg)), reference);
  const double bf16 = max_rel(grads_with(pg, hooks::bf16_compress_hook(pg)), reference);
  const double avg = max_rel(grads_with(pg, hooks::allreduce_hook(pg)), reference);
  // Tolerances of the wire dtype: fp16 has an 11-bit significand (2^-11 = 4.9e-4 relative
  // rounding), bf16 an 8-bit one (3.9e-3); a norm-wise error stays below one ulp.
  require(fp16 < 1e-3 && fp16 > 0, "fp16 hook error " + std::to_string(fp16));
  require(bf16 < 8e-3 && bf16 > fp16, "bf16 hook error " + std::to_string(bf16));
  require(avg < 1e-6, "allreduce hook differs from the built-in average: " + std::to_string(avg));

  // noop communicates nothing: each rank keeps its own gradient, which differs from the average
  // at world > 1 (every rank has its own batch) and equals it at world 1.
  const auto own = grads_with(pg, hooks::noop_hook());
  const double noop = max_rel(own, reference);
  if (pg->world_size() == 1) {
    require(noop < 1e-6, "noop at world 1 differs from the average: " + std::to_string(noop));
  } else {
    require(noop > 1e-3, "noop at world > 1 equals the average: " + std::to_string(noop));
  }

  auto sum = std::make_shared<SumHook>(pg);
  const auto summed = grads_with(pg, sum);
  require(sum->calls > 1, "the user hook was not called for every bucket");
  for (size_t i = 0; i < summed.size(); ++i) {
    require((summed[i] - reference[i] * pg->world_size()).norm().item<double>() <=
                1e-5 * summed[i].norm().item<double>(),
            "a user hook's sum is not world_size times the average");
  }
}

DDP_WORKER_TEST_PER_WORLD(Hooks, BuiltinsMatchAllreduceAndUserHookIsHonoured, builtin_hooks, 1, 2,
                          3);

DDP_TEST_WORKER(hook_after_backward) {
  auto pg = worker_process_group();
  auto w = models::make_workload("net", {8});
  Model model(w.module, pg);
  auto [x, y] = w.batch(0, 4);
  w.loss(model(x), y).backward();
  require_error_says([&] { model.register_comm_hook(hooks::fp16_compress_hook(pg)); },
                     {"register_comm_hook must be called before the first backward"});
}

TEST(Hooks, RegisteringAfterTheFirstBackwardIsAnError) {
  EXPECT_WORKERS_PASS(run_workers(hook_after_backward, 1));
}

// PowerSGD (rank 2, compression from iteration 5) against plain averaging on the same task: the
// final loss must come within a factor 1.5 of allreduce's, and training must make progress.
DDP_TEST_WORKER(powersgd_training) {
  auto pg = worker_process_group();
  auto train = [&](bool powersgd) {
    auto w = models::make_workload("mlp", {32});
    Model model(w.module, pg);
    if (powersgd) {
      hooks::PowerSGDOptions o;
      o.matrix_approximation_rank = 2;
      o.start_powerSGD_iter = 5;
      model.register_comm_hook(hooks::powersgd_hook(pg, o));
    }
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    double first = 0, last = 0;
    for (int step = 0; step < 120; ++step) {
      auto [x, y] = w.batch(step * 48 + pg->rank() * 16, 16);
      opt.zero_grad();
      auto loss = w.loss(model(x), y);
      loss.backward();
      opt.step();
      auto global = loss.detach().reshape({1}).clone();
      pg->allreduce_sum(global, "loss");
      last = global.item<double>() / pg->world_size();
      if (step == 0) first = last;
    }
    return std::make_pair(first, last);
  };
  const auto [first, plain] = train(false);
  const auto [first2, compressed] = train(true);
  require(first == first2, "both runs must start from the same loss");
  require(compressed < 0.5 * first, "PowerSGD did not learn: " + std::to_string(compressed));
  require(compressed < 1.5 * plain, "PowerSGD final loss " + std::to_string(compressed) +
                                        " is not within 1.5x of allreduce's " +
                                        std::to_string(plain));
}

DDP_WORKER_TEST_PER_WORLD(PowerSGDTraining, FinalLossWithinAFactorOfAllreduce, powersgd_training, 2,
                          3);

// PowerSGD from iteration 0 without graph planning, on a model used in the opposite order of its
// registration: the plan starts in reverse registration order and is rebuilt after iteration 1
// from the observed order, under live PowerSGD state. Only `late.weight` (16x16) is compressed
// ((16 + 16) * 1 * 2 < 256; early's 16x2 is not), so its Q draw and the packed average of the
// rest do not depend on bucket layout: the run must end where the same run with graph planning
// (the observed order from iteration 0, no rebuild) ends, up to the all-reduces' summation order.
struct LateEarlyImpl : torch::nn::Module {
  LateEarlyImpl() {
    late = register_module("late", torch::nn::Linear(16, 16));  // registered first, used last
    early = register_module("early", torch::nn::Linear(2, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return late(torch::relu(early(x))); }
  torch::nn::Linear late{nullptr}, early{nullptr};
};
TORCH_MODULE(LateEarly);

DDP_TEST_WORKER(powersgd_after_rebuild) {
  auto pg = worker_process_group();
  auto train = [&](bool graph_planning) {
    torch::manual_seed(5);
    LateEarly net;
    parallel::DDPOptions options;
    options.graph_planning = graph_planning;
    parallel::DistributedDataParallel<LateEarly> model(net, pg, options);
    hooks::PowerSGDOptions o;
    o.start_powerSGD_iter = 0;
    model.register_comm_hook(hooks::powersgd_hook(pg, o));
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.05));
    for (int step = 0; step < 5; ++step) {
      torch::manual_seed(100 * step + pg->rank());
      auto x = torch::randn({8, 2});
      auto y = torch::randn({8, 16});
      opt.zero_grad();
      torch::mse_loss(model(x), y).backward();
      opt.step();
    }
    std::vector<torch::Tensor> params;
    for (const auto& p : model.parameters()) params.push_back(p.detach().clone());
    return std::make_pair(params, model.num_plan_changes());
  };
  const auto [rebuilt, rebuilds] = train(false);
  const auto [planned, plan_changes] = train(true);
  require(rebuilds == 1,
          "without graph planning the plan must be rebuilt once, got " + std::to_string(rebuilds));
  require(plan_changes == 1,
          "graph planning must set the plan once, got " + std::to_string(plan_changes));
  for (size_t i = 0; i < rebuilt.size(); ++i) {
    const double err = ((rebuilt[i] - planned[i]).norm() / planned[i].norm()).item<double>();
    require(err < 1e-5, "parameter " + std::to_string(i) + " differs between the rebuilt and " +
                            "planned runs: relative error " + std::to_string(err));
  }
}

DDP_WORKER_TEST_PER_WORLD(PowerSGDRebuild, StartIterZeroSurvivesThePostIterationOneRebuild,
                          powersgd_after_rebuild, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
