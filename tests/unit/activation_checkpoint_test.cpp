// ddp::activation_checkpoint alone, under DDP and under FULLY_SHARD. Alone: gradients of every
// parameter and of the input equal those of the same net without checkpointing (rel. err < 1e-5),
// and the block's internal autograd nodes are absent from the graph (nothing of it is kept); with
// dropout the recompute sees forward's mask and leaves the RNG stream as it found it. Under DDP and
// FULLY_SHARD at world 1, 2, 3: the seed's Net(checkpoint=True) trains as the single-process
// oracle of the plain Net on the global batch.

#include "ddp/unit/activation_checkpoint.hpp"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <optional>
#include <unordered_set>

#include "ddp/autograd/accumulation_hook.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/test_nets.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using torch::autograd::Node;

// pre -> block (Linear, Tanh, [Dropout], Linear) -> post; the block is what gets checkpointed.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(double dropout = 0.0) {
    pre = register_module("pre", torch::nn::Linear(6, 8));
    block = register_module(
        "block", torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Tanh(),
                                       torch::nn::Dropout(dropout), torch::nn::Linear(8, 8)));
    post = register_module("post", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed) {
    const auto h = pre(x);
    auto run_block = [this](const torch::Tensor& in) { return block->forward(in); };
    return post(checkpointed ? activation_checkpoint(*block, run_block, h) : run_block(h));
  }
  torch::nn::Linear pre{nullptr}, post{nullptr};
  torch::nn::Sequential block{nullptr};
};
TORCH_MODULE(Mlp);

Mlp make_mlp(double dropout = 0.0) {
  torch::manual_seed(0);
  return Mlp(dropout);
}

std::vector<std::string> names_of(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& item : m.named_parameters()) out.push_back(item.key());
  return out;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad());
  return out;
}

// The gradients of every parameter and of the input: `ckpt`'s (fed `x_ckpt`) equal `plain`'s.
void require_same_gradients(torch::nn::Module& plain, torch::nn::Module& ckpt,
                            const torch::Tensor& x_plain, const torch::Tensor& x_ckpt,
                            const std::string& what) {
  auto names = names_of(plain);
  names.push_back("input");
  auto expected = grads_of(plain), got = grads_of(ckpt);
  expected.push_back(x_plain.grad());
  got.push_back(x_ckpt.grad());
  require_close(names, got, expected, 1e-5, what);
}

// Autograd nodes reachable from `root` that are not leaves' AccumulateGrad: the graph a backward
// executes, and what forward keeps alive (each holds its saved tensors).
std::vector<Node*> interior_nodes(const std::shared_ptr<Node>& root) {
  std::vector<Node*> out;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack{root.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (!dynamic_cast<torch::autograd::AccumulateGrad*>(n)) out.push_back(n);
    for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
  }
  return out;
}

std::vector<Node*> checkpoint_nodes(const std::vector<Node*>& nodes) {
  std::vector<Node*> out;
  for (Node* n : nodes) {
    if (n->name().find("CheckpointFunction") != std::string::npos) out.push_back(n);
  }
  return out;
}

TEST(ActivationCheckpoint, GradientsEqualTheUncheckpointedNetAndNoBlockNodeIsKept) {
  auto plain = make_mlp(), ckpt = make_mlp();
  torch::manual_seed(1);
  const auto x = torch::randn({5, 6});
  const auto x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
  const auto out1 = plain->forward(x1, false), out2 = ckpt->forward(x2, true);
  EXPECT_TRUE(torch::equal(out1, out2));

  // The block's interior (Addmm, Tanh, Dropout's Mul or nothing, Addmm) is one node in the
  // checkpointed graph; its edges are the input and the block's four parameters.
  const auto block_alone = plain->block->forward(torch::randn({2, 8}, torch::requires_grad()));
  const auto in_block = interior_nodes(block_alone.grad_fn()).size();
  const auto plain_nodes = interior_nodes(out1.grad_fn()),
             ckpt_nodes = interior_nodes(out2.grad_fn());
  EXPECT_EQ(plain_nodes.size() - ckpt_nodes.size(), in_block - 1);
  EXPECT_TRUE(checkpoint_nodes(plain_nodes).empty());
  const auto found = checkpoint_nodes(ckpt_nodes);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0]->next_edges().size(), 1u + 4u);

  out1.pow(2).sum().backward();
  out2.pow(2).sum().backward();
  require_same_gradients(*plain, *ckpt, x1, x2, "checkpointed block");
}

// The sharded styles and TP count a parameter's gradients with accumulation hooks: through a
// checkpoint each runs once per backward, with the gradient the uncheckpointed net accumulates.
// On libtorch 2.x a plain tensor hook also ran inside the recompute's grad() (issue 59).
TEST(ActivationCheckpoint, ParametersAccumulationHooksRunOncePerBackward) {
  auto plain = make_mlp(), ckpt = make_mlp();
  torch::manual_seed(1);
  const auto x = torch::randn({5, 6});
  std::vector<std::vector<torch::Tensor>> seen(ckpt->parameters().size());
  std::vector<std::pair<torch::Tensor, unsigned>> ids;
  for (size_t i = 0; i < seen.size(); ++i) {
    const auto p = ckpt->parameters()[i];
    ids.emplace_back(p, autograd::add_accumulation_hook(p, [&seen, i](const torch::Tensor& g) {
                       seen[i].push_back(g.clone());
                     }));
  }
  plain->forward(x, false).pow(2).sum().backward();
  for (int step = 1; step <= 2; ++step) {
    ckpt->forward(x, true).pow(2).sum().backward();
    const auto expected = grads_of(*plain);
    for (size_t i = 0; i < seen.size(); ++i) {
      ASSERT_EQ(seen[i].size(), static_cast<size_t>(step)) << names_of(*ckpt)[i];
      require_close({names_of(*ckpt)[i]}, {seen[i].back()}, {expected[i]}, 1e-5, "hook's gradient");
    }
  }
  for (auto& [p, id] : ids) p.remove_hook(id);
}

TEST(ActivationCheckpoint, DropoutSeesForwardsMaskAndTheRngStreamIsPutBack) {
  auto plain = make_mlp(0.5), ckpt = make_mlp(0.5);
  const auto x = torch::randn({16, 6});
  auto run = [&](Mlp& net, bool checkpointed, uint64_t seed) {
    torch::manual_seed(seed);
    net->forward(x, checkpointed).pow(2).sum().backward();
    return torch::rand({8});  // the draw after backward
  };
  const auto draw1 = run(plain, false, 7), draw2 = run(ckpt, true, 7);
  require_close(names_of(*plain), grads_of(*ckpt), grads_of(*plain), 1e-5, "dropout p=0.5");
  EXPECT_TRUE(torch::equal(draw1, draw2)) << draw1 << draw2;

  // The comparison can fail: another mask gives other gradients.
  auto other = make_mlp(0.5);
  run(other, false, 8);
  const auto diff = (grads_of(*other)[2] - grads_of(*plain)[2]).norm().item<double>();
  EXPECT_GT(diff, 1e-3);
}

TEST(ActivationCheckpoint, FirstLayerParametersGetGradientsWhenTheInputNeedsNone) {
  torch::manual_seed(0);
  torch::nn::Linear plain(6, 4), ckpt(6, 4);
  {
    torch::NoGradGuard no_grad;
    ckpt->weight.copy_(plain->weight);
    ckpt->bias.copy_(plain->bias);
  }
  const auto x = torch::randn({5, 6});
  plain(x).pow(2).sum().backward();
  const auto out = activation_checkpoint(
      *ckpt, [&](const torch::Tensor& in) { return ckpt(in); }, x);
  ASSERT_TRUE(out.requires_grad());
  out.pow(2).sum().backward();
  require_close(names_of(*plain), grads_of(*ckpt), grads_of(*plain), 1e-5, "first layer");
}

// Two inputs (one an integer index that needs no gradient) and three outputs: a float output the
// loss uses, an integer output (no gradient) and a float output the loss ignores (its incoming
// gradient is undefined).
TEST(ActivationCheckpoint, SeveralInputsAndOutputs) {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 4);
  const auto a = torch::randn({3, 4});
  const auto idx = torch::tensor({2, 0, 1});
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    const auto y = torch::tanh(lin(in[0])).index_select(0, in[1]);
    return std::vector<torch::Tensor>{y, y.argmax(1), y.exp()};
  };
  const auto a1 = a.clone().requires_grad_(), a2 = a.clone().requires_grad_();
  fn({a1, idx})[0].sum().backward();
  const auto ref_a = a1.grad();
  const auto ref_w = lin->weight.grad().clone(), ref_b = lin->bias.grad().clone();
  lin->zero_grad();
  const auto outs = activation_checkpoint(*lin, fn, {a2, idx});
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_FALSE(outs[1].requires_grad());
  outs[0].sum().backward();
  require_close({"input", "weight", "bias"}, {a2.grad(), lin->weight.grad(), lin->bias.grad()},
                {ref_a, ref_w, ref_b}, 1e-5, "multi-output checkpoint");
}

TEST(ActivationCheckpoint, WrapperModuleCheckpointsTheWrappedForward) {
  torch::manual_seed(0);
  torch::nn::Linear plain(4, 3);
  unit::CheckpointWrapper<torch::nn::Linear> wrapped(torch::nn::Linear(4, 3));
  {
    torch::NoGradGuard no_grad;
    wrapped->module()->weight.copy_(plain->weight);
    wrapped->module()->bias.copy_(plain->bias);
  }
  EXPECT_EQ(names_of(*wrapped), (std::vector<std::string>{"_checkpoint_wrapped_module.weight",
                                                          "_checkpoint_wrapped_module.bias"}));
  const auto x = torch::randn({2, 4});
  plain(x).pow(2).sum().backward();
  const auto out = wrapped(x);
  EXPECT_NE(out.grad_fn()->name().find("CheckpointFunction"), std::string::npos);
  out.pow(2).sum().backward();
  require_close(names_of(*plain), grads_of(*wrapped), grads_of(*plain), 1e-5, "wrapper");
}

TEST(ActivationCheckpoint, FnRunsTwiceWithGradAndOnceWithout) {
  torch::nn::Linear lin(4, 4);
  int calls = 0;
  auto fn = [&](const torch::Tensor& in) {
    ++calls;
    return lin(in);
  };
  const auto x = torch::randn({2, 4});
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(activation_checkpoint(*lin, fn, x).requires_grad());
  }
  EXPECT_EQ(calls, 1);
  activation_checkpoint(*lin, fn, x).sum().backward();
  EXPECT_EQ(calls, 3);
}

TEST(ActivationCheckpoint, RecomputeRunsUnderForwardsAutocast) {
  auto plain = make_mlp(), ckpt = make_mlp();
  const auto x = torch::randn({5, 6});
  torch::Tensor out1, out2;
  {
    parallel::AutocastGuard autocast(c10::kCPU, torch::kBFloat16);
    out1 = plain->forward(x, false);
    out2 = ckpt->forward(x, true);
  }
  ASSERT_EQ(out2.scalar_type(), torch::kBFloat16);
  // Backward outside autocast, as AutocastGuard asks: the recompute must switch it back on.
  out1.to(torch::kFloat).pow(2).sum().backward();
  out2.to(torch::kFloat).pow(2).sum().backward();
  require_close(names_of(*plain), grads_of(*ckpt), grads_of(*plain), 1e-5, "bf16 autocast");
}

TEST(ActivationCheckpoint, RefusesAnUndefinedOutput) {
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({2, 4});
  EXPECT_EQ(error_of([&] {
              activation_checkpoint(
                  *lin, [](const torch::Tensor&) { return torch::Tensor(); }, x);
            }),
            "ddp::activation_checkpoint: the checkpointed function returned an undefined tensor at "
            "output 0; "
            "return defined tensors (compute optional values outside the checkpoint)");
}

TEST(ActivationCheckpoint, RefusesARecomputeOfAnotherShape) {
  torch::nn::Linear lin(4, 4);
  int calls = 0;
  auto fn = [&](const torch::Tensor& in) { return lin(++calls == 1 ? in : in.narrow(0, 0, 1)); };
  const auto out = activation_checkpoint(*lin, fn, torch::randn({2, 4}));
  EXPECT_EQ(
      error_of([&] { out.sum().backward(); }),
      "ddp::activation_checkpoint: the recompute returned outputs of sizes [[1, 4]] but forward "
      "returned [[2, 4]]; the checkpointed function must compute the same outputs from the "
      "same inputs");
}

TEST(ActivationCheckpoint, RefusesAParameterOutsideTheGivenModule) {
  torch::nn::Linear lin(4, 4), other(4, 2);
  const auto out = activation_checkpoint(
      *lin, [&](const torch::Tensor& in) { return other(lin(in)); }, torch::randn({2, 4}));
  EXPECT_EQ(error_of([&] { out.sum().backward(); }),
            "ddp::activation_checkpoint: the checkpointed function reads a tensor of sizes [2, 4] "
            "that requires "
            "grad but is neither an input nor a parameter of the module passed to checkpoint, so "
            "it would get no gradient; pass the module that owns it (a parent of every module fn "
            "calls)");
}

// [Note: the recompute's last projection] A residual block whose last projection is
// output_linear: its value is at::linear's in forward and the bias alone in the recompute (the
// GEMM not run), and every gradient equals the uncheckpointed block's, in fp32 and under bf16
// autocast, with a 3-D input, with a bias (the zoo's GPT) and without (its Llama: torch 2.x refused
// the first version, which handed the node an undefined bias).
struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(bool bias = true) {
    up = register_module("up", torch::nn::Linear(4, 6));
    down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(6, 4).bias(bias)));
  }
  // x + down(tanh(up(x))); `seen` gets down's output of each call.
  torch::Tensor forward(const torch::Tensor& x, std::vector<torch::Tensor>* seen) {
    const auto y = output_linear(torch::tanh(up(x)), down->weight, down->bias);
    if (seen != nullptr) seen->push_back(y.detach().clone());
    return x + y;
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(ResidualBlock);

void expect_output_linear_equals_plain(std::optional<c10::ScalarType> autocast, bool bias) {
  torch::manual_seed(0);
  ResidualBlock plain(bias), ckpt(bias);
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    torch::NoGradGuard no_grad;
    ckpt->parameters()[i].copy_(plain->parameters()[i]);
  }
  const auto x = torch::randn({2, 3, 4});
  const auto x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
  std::vector<torch::Tensor> seen, seen_plain;
  torch::Tensor out1, out2;
  {
    std::optional<parallel::AutocastGuard> guard;
    if (autocast) guard.emplace(c10::kCPU, *autocast);
    out1 = plain->forward(x1, &seen_plain);
    out2 = activation_checkpoint(
        *ckpt, [&](const torch::Tensor& in) { return ckpt->forward(in, &seen); }, x2);
  }
  EXPECT_TRUE(torch::equal(out1, out2));
  out1.to(torch::kFloat).pow(2).sum().backward();
  out2.to(torch::kFloat).pow(2).sum().backward();
  ASSERT_EQ(seen.size(), 2u);  // forward, then the recompute
  EXPECT_TRUE(torch::equal(seen[0], seen_plain[0]));
  // The recompute's value: no product, the bias alone (added in the output's dtype).
  auto bias_alone = torch::zeros_like(seen[0]);
  if (bias) bias_alone = bias_alone + ckpt->down->bias.to(seen[0].scalar_type());
  EXPECT_TRUE(torch::equal(seen[1], bias_alone));
  require_same_gradients(*plain, *ckpt, x1, x2, "output_linear's block");
}

TEST(ActivationCheckpoint, TheLastProjectionIsNotRecomputedAndItsGradientsAreLinears) {
  for (const bool bias : {true, false}) {  // the zoo's GPT has one, its Llama none
    SCOPED_TRACE(bias ? "with a bias" : "without a bias");
    expect_output_linear_equals_plain(std::nullopt, bias);
    expect_output_linear_equals_plain(torch::kBFloat16, bias);
  }
}

// Two such blocks in one checkpoint: the first block's skipped projection feeds the second's tanh,
// whose backward reads values; refused by name instead of a gradient from zeros.
TEST(ActivationCheckpoint, RefusesASkippedProjectionWhoseOutputIsReadOnTheWay) {
  torch::nn::Sequential both;
  ResidualBlock first, second;
  both->push_back(first);
  both->push_back(second);
  const auto out = activation_checkpoint(
      *both,
      [&](const torch::Tensor& in) {
        return second->forward(first->forward(in, nullptr), nullptr);
      },
      torch::randn({2, 4}, torch::requires_grad()));
  EXPECT_EQ(error_of([&] { out.sum().backward(); }),
            "ddp::activation_checkpoint: a projection the recompute skips (output_linear: a "
            "block's last projection) reaches the checkpointed function's output through "
            "AddmmBackward0, whose backward reads values, so its gradient would be computed from "
            "zeros; checkpoint each block on its own, or call at::linear there");
}

TEST(ActivationCheckpoint, RefusesDoubleBackward) {
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({2, 4}, torch::requires_grad());
  const auto out = activation_checkpoint(
      *lin, [&](const torch::Tensor& in) { return lin(in); }, x);
  EXPECT_EQ(
      error_of([&] { torch::autograd::grad({out.pow(2).sum()}, {x}, {}, true, true); }),
      "ddp::activation_checkpoint: backward with create_graph=true (double backward) through a "
      "checkpoint is not supported: the recompute's gradients carry no graph");
}

// Inside a CUDA graph capture a generator's state can be neither read nor set: a checkpointed block
// that draws (dropout) is refused by name at the capture, which falls back to eager steps, and one
// that draws nothing is captured (the GPU matrix, Styles/CheckpointMatrixGpu.*). On the GPU stage.
TEST(ActivationCheckpointGpu, ABlockThatDrawsIsRefusedByNameAtTheCaptureAndRunsEagerly) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  for (const double dropout : {0.0, 0.5}) {
    auto net = make_mlp(dropout);
    net->to(cuda);
    const auto x = torch::randn({5, 6}, cuda);
    graphs::CapturedStepOptions options;
    options.warmup_steps = 2;
    graphs::CapturedStep step(
        [&] {
          for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
          net->forward(x, /*checkpointed=*/true).pow(2).sum().backward();
        },
        cuda, options);
    for (int i = 0; i < 4; ++i) step.run();
    torch::cuda::synchronize();
    if (dropout == 0) {
      EXPECT_EQ(step.state(), graphs::CapturedStep::State::kReplaying) << step.fallback_reason();
      continue;
    }
    EXPECT_EQ(step.state(), graphs::CapturedStep::State::kEager);
    EXPECT_NE(step.fallback_reason().find(
                  "ddp::activation_checkpoint: the checkpointed function drew random numbers on "
                  "cuda:0 in forward during a CUDA graph capture (dropout?)"),
              std::string::npos)
        << step.fallback_reason();
    EXPECT_TRUE(net->block[0]->as<torch::nn::Linear>()->weight.grad().defined());
  }
}

// The seed's Net(checkpoint=True) under DDP against the oracle of the plain Net.
DDP_TEST_WORKER(checkpoint_ddp) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.dim = 24;
  spec.model = "net";
  const TrainResult oracle = train_single(spec, pg->world_size());
  spec.model = "net-checkpoint";
  const TrainResult got = train_ddp(spec, pg, parallel::DDPOptions{});
  require(got.names == oracle.names, "parameter names differ from the plain Net's");
  require_close(got.names, got.params, oracle.params, 1e-5,
                "Net(checkpoint=True) under DDP, rank " + std::to_string(pg->rank()));
}

// Under FULLY_SHARD, a unit per layer: fc1's recompute reads its unit's gathered parameters.
DDP_TEST_WORKER(checkpoint_fully_shard) {
  auto pg = worker_process_group();
  const int w = pg->world_size(), r = pg->rank();
  const int64_t dim = 6, per_rank = 4, steps = 3;
  torch::manual_seed(0);
  CheckpointNet net(dim);
  torch::manual_seed(0);
  models::Net oracle(dim);
  shard::ShardOptions options;
  options.units = {"fc1", "fc2", "fc3", "fc4"};
  shard::FullyShardedDataParallel<CheckpointNet> model(net, pg, options);
  auto opt = make_test_optimizer("sgd", net->parameters(), 0.05);
  auto oracle_opt = make_test_optimizer("sgd", oracle->parameters(), 0.05);
  torch::manual_seed(1);
  for (int64_t s = 0; s < steps; ++s) {
    const auto x = torch::randn({w * per_rank, dim}), y = torch::randn({w * per_rank, dim});
    torch::mse_loss(model(x.narrow(0, r * per_rank, per_rank)), y.narrow(0, r * per_rank, per_rank))
        .backward();
    opt->step();
    opt->zero_grad();
    torch::mse_loss(oracle->forward(x), y).backward();
    oracle_opt->step();
    oracle_opt->zero_grad();
  }
  require_close_by_name(whole_parameters(model), *oracle, 1e-5,
                        "Net(checkpoint=True) under FULLY_SHARD");
}

DDP_WORLD_SUITE(CheckpointDistributed, 1, 2, 3);

DDP_WORKER_TEST_P(CheckpointDistributed, DdpEqualsSingleProcessTraining, checkpoint_ddp);

DDP_WORKER_TEST_P(CheckpointDistributed, FullyShardEqualsSingleProcessTraining,
                  checkpoint_fully_shard);

}  // namespace
}  // namespace ddp::testing
