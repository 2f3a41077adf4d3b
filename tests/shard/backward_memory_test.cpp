// A sharded step's memory, measured: every CPU tensor storage counted (obs::count_cpu_memory)
// from before the model is built, the peak taken over the backward alone. Four (and eight)
// Linear(1032, 1032) layers, one unit each (the zoo MLP, 4.3 MB of fp32 weights a layer; its last
// layer has 1031 rows, which DEFAULT replicates at worlds 2 and 3), Gloo, worlds 2 and 3. Wide
// enough that a unit more or less held is four times the slack; at width 2052 the test took 37 s
// of the suite's CPU, most of it faulting in pages.
//
// What it holds (docs/design/sharding.md, "Where a step's memory goes"):
//  - FULLY_SHARD per unit: during backward a rank holds what it held when backward began, plus at
//    most: the gradient shards written so far (all of them by the end), the units the prefetch
//    allows gathered at once (the one computing and the one prefetched), one unit's full
//    gradients (autograd makes them before they are copied out) and one unit's reduce buffers (its
//    (world, S) input and S output). Closed form from the shard plan.
//  - That peak is below DDP's by at least a third of the parameters' bytes at world 2.
//  - The transient part (peak - at the start - gradient shards) does not grow with the number of
//    units: eight units need no more than four.
//  - DEFAULT: the same bound with its replicated layer held as DDP holds it (the bucket storage
//    exists before backward; one bucket's fresh gradients on top).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>

#include "ddp/models/mlp.hpp"
#include "ddp/obs/cpu_memory.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kWidth = 1032;     // divides by 2, 3 and 4: every hidden layer shards evenly
constexpr int64_t kRowsOut = 1031;   // divides by neither 2 nor 3: DEFAULT replicates that layer
constexpr int64_t kBatch = 12;       // per rank
constexpr int64_t kSlack = 1 << 20;  // the activations' gradients and scalars of one step

models::MLP make_mlp(int64_t depth) {
  models::MLPOptions o;
  o.in = o.hidden = kWidth;
  o.out = kRowsOut;
  o.depth = depth;
  torch::manual_seed(0);
  return models::MLP(o);
}

// A backward's memory, relative to the bytes alive before the model was built.
struct BackwardMemory {
  int64_t at_start = 0;  // when backward begins: parameters, activations, buffers
  int64_t peak = 0;      // the most alive at once during backward
  int64_t grads = 0;     // the gradients' bytes when it ends
  std::string describe() const {
    return "at the start " + std::to_string(at_start) + " B, peak " + std::to_string(peak) +
           " B, gradients at the end " + std::to_string(grads) + " B";
  }
};

// Three steps (the first learns the unit order), the third measured; gradients dropped between
// steps (zero_grad(set_to_none)), no optimizer: the parameters stay what they are.
template <typename Model>
BackwardMemory measure(Model& model, const std::vector<torch::Tensor>& params, int64_t base) {
  BackwardMemory m;
  for (int step = 0; step < 3; ++step) {
    for (auto p : params) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(100 + step);
    const auto x = torch::randn({kBatch, kWidth});
    const auto loss = model(x).square().mean();
    m.at_start = obs::cpu_allocated_bytes() - base;
    obs::reset_cpu_peak();
    loss.backward();
    m.peak = obs::cpu_peak_allocated_bytes() - base;
    m.grads = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) m.grads += p.grad().numel() * p.grad().element_size();
    }
  }
  for (auto p : params) p.mutable_grad() = torch::Tensor();
  return m;
}

int64_t bytes_of(const std::vector<torch::Tensor>& params) {
  int64_t bytes = 0;
  for (const auto& p : params) bytes += p.numel() * p.element_size();
  return bytes;
}

BackwardMemory ddp_memory(const comm::ProcessGroupPtr& pg, int64_t depth) {
  const int64_t base = obs::cpu_allocated_bytes();
  auto net = make_mlp(depth);
  parallel::DistributedDataParallel<models::MLP> model(net, pg);
  return measure(model, net->parameters(), base);
}

// The closed-form bound of the header for `model`'s plan, on top of what backward began with.
struct ShardBound {
  int64_t largest_full = 0;    // the largest unit's (world, S) bytes
  int64_t largest_shard = 0;   // its S bytes
  int64_t replicated = 0;      // DEFAULT's replicated parameters' bytes
  int64_t sharded_params = 0;  // bytes of the sharded parameters, whole
  int64_t transient() const {
    // Gathered: the unit computing and the one prefetched; one unit's full gradients; one unit's
    // reduce input and output; the replicated parameters' fresh gradients (one bucket).
    return 2 * largest_full + largest_full + largest_full + largest_shard + replicated;
  }
};

ShardBound bound_of(const shard::ShardPlan& plan, int world) {
  ShardBound b;
  for (const auto& unit : plan.units) {
    int64_t full = 0;
    for (size_t i : unit.params) {
      const auto& s = plan.params[i];
      int64_t numel = 1;
      for (int64_t d : plan.shapes[i].shape) numel *= d;
      if (s.sharded()) {
        full += s.local_numel() * world * 4;
        b.sharded_params += numel * 4;
      } else {
        b.replicated += numel * 4;
      }
    }
    b.largest_full = std::max(b.largest_full, full);
  }
  b.largest_shard = b.largest_full / world;
  return b;
}

struct Sharded {
  BackwardMemory memory;
  ShardBound bound;
};

Sharded sharded_memory(const comm::ProcessGroupPtr& pg, int64_t depth,
                       shard::DataParallelStyle style) {
  const int64_t base = obs::cpu_allocated_bytes();
  auto net = make_mlp(depth);
  shard::ShardOptions options;
  options.style = style;
  for (int64_t i = 0; i < depth; ++i) options.units.push_back("layers." + std::to_string(i));
  shard::FullyShardedDataParallel<models::MLP> model(net, pg, options);
  Sharded out;
  out.memory = measure(model, net->parameters(), base);
  out.bound = bound_of(model.plan(), pg->world_size());
  return out;
}

DDP_TEST_WORKER(backward_memory) {
  obs::count_cpu_memory();  // before any model: every storage of a step is counted
  auto pg = worker_process_group(std::chrono::seconds(120));
  const int w = pg->world_size();
  const std::string who = "world " + std::to_string(w) + " rank " + std::to_string(pg->rank());
  const BackwardMemory ddp = ddp_memory(pg, 4);
  const int64_t param_bytes = bytes_of(make_mlp(4)->parameters());
  const auto check = [&](const std::string& name, const Sharded& s, int64_t saving) {
    const BackwardMemory& m = s.memory;
    const std::string ctx = who + ", " + name + ": " + m.describe() + "; DDP: " + ddp.describe() +
                            "; transient bound " + std::to_string(s.bound.transient()) + " B";
    if (pg->rank() == 0) std::cerr << ctx << std::endl;
    require(m.peak <= m.at_start + m.grads + s.bound.transient() + kSlack,
            ctx + ": the backward holds more than the closed form allows");
    if (w == 2 && saving > 0) {
      require(m.peak <= ddp.peak - saving,
              ctx + ": not below DDP's peak by " + std::to_string(saving) + " B");
    }
    return m.peak - m.at_start - m.grads;
  };
  const Sharded fully4 = sharded_memory(pg, 4, shard::DataParallelStyle::kFullyShard);
  const int64_t transient4 = check("FULLY_SHARD, 4 units", fully4, param_bytes / 3);
  const Sharded fully8 = sharded_memory(pg, 8, shard::DataParallelStyle::kFullyShard);
  const int64_t transient8 = check("FULLY_SHARD, 8 units", fully8, 0);
  require(
      transient8 <= transient4 + kSlack,
      who + ": the transient memory grew with the number of units: " + std::to_string(transient4) +
          " B with 4, " + std::to_string(transient8) + " B with 8");
  const Sharded dflt = sharded_memory(pg, 4, shard::DataParallelStyle::kDefault);
  require(dflt.bound.replicated > 0, who + ": DEFAULT replicated nothing; the test needs a layer");
  check("DEFAULT, 4 units", dflt, dflt.bound.sharded_params / 3);
}

class ShardedBackwardMemory : public ::testing::TestWithParam<int> {};

TEST_P(ShardedBackwardMemory, ShardedStylesHoldLessThanDdp) {
  EXPECT_WORKERS_PASS(run_workers(backward_memory, GetParam(), {}, {}, std::chrono::seconds(240)));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedBackwardMemory, ::testing::Values(2, 3), world_name);

}  // namespace
}  // namespace ddp::testing
