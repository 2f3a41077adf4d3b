#include "ddp/planner/ready_order.hpp"

#include <gtest/gtest.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ddp/models/gpt.hpp"
#include "ddp/models/net.hpp"
#include "support/test_nets.hpp"

namespace ddp::planner {
namespace {

// One forward of a model: its parameters deduplicated by TensorImpl (the first name of a tied
// tensor is kept) and the output whose graph the prediction reads.
struct Forward {
  std::shared_ptr<torch::nn::Module> module;  // keeps the parameters alive
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  at::Tensor output;
};

Forward collect(std::shared_ptr<torch::nn::Module> module, at::Tensor output) {
  Forward f;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    f.names.push_back(item.key());
    f.params.push_back(item.value());
  }
  f.module = std::move(module);
  f.output = std::move(output);
  return f;
}

// Records, in firing order, which parameter's accumulator ran: a post hook runs right after the
// AccumulateGrad node, which is the point where DDP's reducer sees a gradient as ready.
class RecordReady : public torch::autograd::FunctionPostHook {
 public:
  RecordReady(std::vector<size_t>* order, size_t index) : order_(order), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    order_->push_back(index_);
    return outputs;
  }

 private:
  std::vector<size_t>* order_;  // outlives the hook: observe_ready_order removes it first
  size_t index_;
};

// Runs loss.backward() with a recording hook on every parameter's accumulator and returns the
// indices in the order the engine ran them. The hooks are removed before returning.
std::vector<size_t> observe_ready_order(const std::vector<at::Tensor>& params,
                                        const at::Tensor& loss) {
  std::vector<size_t> order;
  // The accumulators must stay alive: the graph holds them, and a dropped one would be rebuilt
  // without our hook by the next forward.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(params.front()))> accumulators;
  std::vector<uintptr_t> keys;
  for (size_t i = 0; i < params.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(params[i]));
    keys.push_back(accumulators.back()->add_post_hook(std::make_unique<RecordReady>(&order, i)));
  }
  loss.backward();
  for (size_t i = 0; i < accumulators.size(); ++i) accumulators[i]->del_post_hook(keys[i]);
  return order;
}

std::vector<std::string> names_of(const Forward& f, const std::vector<size_t>& order) {
  std::vector<std::string> names;
  for (size_t i : order) names.push_back(f.names.at(i));
  return names;
}

Forward net_forward() {
  auto net = std::make_shared<models::NetImpl>(32);
  auto out = net->forward(torch::randn({4, 32}));
  return collect(net, out);
}

Forward out_of_order_forward() {
  auto net = std::make_shared<ddp::testing::OutOfOrderNetImpl>(16);
  auto out = net->forward(torch::randn({4, 16}));
  return collect(net, out);
}

models::GPTConfig tiny_gpt(bool tie_weights) {
  models::GPTConfig config;
  config.vocab_size = 64;
  config.seq_len = 8;
  config.d_model = 16;
  config.n_heads = 2;
  config.n_layers = 2;
  config.tie_weights = tie_weights;
  return config;
}

Forward gpt_forward() {
  auto gpt = std::make_shared<models::GPTImpl>(tiny_gpt(false));
  auto out = gpt->forward(torch::randint(0, 64, {2, 8}, torch::kLong));
  return collect(gpt, out);
}

Forward gpt_tied_forward() {
  auto gpt = std::make_shared<models::GPTImpl>(tiny_gpt(true));
  auto out = gpt->forward(torch::randint(0, 64, {2, 8}, torch::kLong));
  return collect(gpt, out);
}

Forward tied_forward() {
  auto net = std::make_shared<ddp::testing::TiedNetImpl>(32, 16);
  auto out = net->forward(torch::randint(0, 32, {4}, torch::kLong));
  return collect(net, out);
}

Forward unused_branch_forward() {
  auto net = std::make_shared<ddp::testing::UnusedBranchNetImpl>(16);
  auto out = net->forward(torch::randn({4, 16}));
  return collect(net, out);
}

enum class Loss { kSum, kMse };

at::Tensor make_loss(const at::Tensor& output, Loss loss) {
  if (loss == Loss::kSum) return output.sum();
  return torch::mse_loss(output, torch::zeros_like(output).detach());
}

struct ModelCase {
  const char* name;
  Forward (*forward)();
  size_t distinct_params;  // closed form: what the architecture registers, tied tensors once
};

// Net: 4 Linear. OutOfOrderNet: 3 Linear. GPT (2 blocks): wte, wpe, per block ln_1, c_attn,
// c_proj, ln_2, c_fc, c_proj (12 tensors), ln_f (2), lm_head (1, or tied into wte).
// TiedNet: emb, fc (2), head tied into emb.
const ModelCase kModels[] = {
    {"Net", net_forward, 8},
    {"OutOfOrderNet", out_of_order_forward, 6},
    {"GPT", gpt_forward, 2 + 2 * 12 + 2 + 1},
    {"GPTTied", gpt_tied_forward, 2 + 2 * 12 + 2},
    {"TiedNet", tied_forward, 3},
};

// Readable parameter names in gtest's failure messages.
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(Loss loss, std::ostream* os) { *os << (loss == Loss::kSum ? "sum" : "mse"); }

class ReadyOrder : public ::testing::TestWithParam<std::tuple<ModelCase, Loss>> {};

// The prediction, made before backward from the forward graph alone, is exactly the order the
// engine then runs the accumulators in. GPT also pins ties: a LayerNorm's weight and bias
// accumulators are ready at the same moment with equal priority, and only replaying the engine's
// heap gives its order (weight, then bias) instead of some other tie-break.
TEST_P(ReadyOrder, PredictionMatchesObservedBackward) {
  const ModelCase model = std::get<0>(GetParam());
  const Loss loss_kind = std::get<1>(GetParam());
  torch::manual_seed(0);
  const Forward f = model.forward();
  ASSERT_EQ(f.params.size(), model.distinct_params);

  const std::vector<size_t> predicted = predict_ready_order({f.output}, f.params);
  // Prediction only reads the graph: a second one agrees, and backward below still runs on it.
  EXPECT_EQ(predict_ready_order({f.output}, f.params), predicted);
  const std::vector<size_t> observed =
      observe_ready_order(f.params, make_loss(f.output, loss_kind));

  EXPECT_EQ(names_of(f, predicted), names_of(f, observed));
  // Every parameter of these models takes part in forward, so each is ready exactly once.
  EXPECT_EQ(predicted.size(), f.params.size());
}

INSTANTIATE_TEST_SUITE_P(Models, ReadyOrder,
                         ::testing::Combine(::testing::ValuesIn(kModels),
                                            ::testing::Values(Loss::kSum, Loss::kMse)),
                         [](const ::testing::TestParamInfo<ReadyOrder::ParamType>& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) == Loss::kSum ? "_Sum" : "_Mse");
                         });

// OutOfOrderNet applies fc3, fc1, fc2, so backward reaches fc2 first and fc3 last: neither the
// registration order nor its reverse. Within a layer the bias comes first: AddmmBackward's edges
// are (bias, input, weight.t()), the bias accumulator is ready at once, while the weight waits
// behind TBackward.
TEST(ReadyOrderOutOfOrderNet, IsNeitherRegistrationOrderNorItsReverse) {
  torch::manual_seed(0);
  const Forward f = out_of_order_forward();
  ASSERT_EQ(f.names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                               "fc3.weight", "fc3.bias"}));
  const auto predicted = names_of(f, predict_ready_order({f.output}, f.params));
  EXPECT_EQ(predicted, (std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight",
                                                 "fc3.bias", "fc3.weight"}));
  std::vector<std::string> reversed(f.names.rbegin(), f.names.rend());
  EXPECT_NE(predicted, reversed);
}

// UnusedBranchNet never calls "unused": its parameters have no accumulator in the graph and are
// left out, for the caller to append.
TEST(ReadyOrderUnused, UnusedParametersAreAbsent) {
  torch::manual_seed(0);
  const Forward f = unused_branch_forward();
  const auto predicted = names_of(f, predict_ready_order({f.output}, f.params));
  EXPECT_EQ(predicted,
            (std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"}));
  const auto observed = names_of(f, observe_ready_order(f.params, f.output.sum()));
  EXPECT_EQ(predicted, observed);
}

// Two accumulators made ready by one node (NativeLayerNormBackward's edges are input, weight,
// bias) have equal priority (UINT64_MAX); the engine's binary heap pops the first pushed first.
TEST(ReadyOrderTies, AccumulatorsReadyTogetherFollowTheEngineHeap) {
  torch::manual_seed(0);
  auto norm = std::make_shared<torch::nn::LayerNormImpl>(std::vector<int64_t>{6});
  const auto y = norm->forward(torch::randn({2, 6}));
  const Forward f = collect(norm, y);
  const auto predicted = names_of(f, predict_ready_order({y}, f.params));
  EXPECT_EQ(predicted, (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(predicted, names_of(f, observe_ready_order(f.params, y.sum())));
}

// Several outputs, one feeding the other: the shared trunk's nodes wait for both consumers (the
// engine counts the edges from its GraphRoot too), as in a backward through y.sum() + h.sum().
TEST(ReadyOrderOutputs, OutputThatFeedsAnotherOutputWaitsForBoth) {
  torch::manual_seed(0);
  auto net = std::make_shared<models::NetImpl>(8);
  const auto h = net->fc2(net->fc1(torch::randn({3, 8})));
  const auto y = net->fc4(net->fc3(h));
  const Forward f = collect(net, y);
  const auto predicted = names_of(f, predict_ready_order({y, h}, f.params));
  EXPECT_EQ(predicted,
            (std::vector<std::string>{"fc4.bias", "fc4.weight", "fc3.bias", "fc3.weight",
                                      "fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"}));
  EXPECT_EQ(predicted, names_of(f, observe_ready_order(f.params, y.sum() + h.pow(2).sum())));
}

// An output that is a parameter is its own gradient source: its accumulator is ready before
// anything in the graph runs.
TEST(ReadyOrderOutputs, ParameterReturnedAsOutputComesFirst) {
  torch::manual_seed(0);
  auto net = std::make_shared<models::NetImpl>(8);
  const auto scale = net->register_parameter("scale", torch::ones({1}));
  const auto y = net->forward(torch::randn({3, 8}));
  const Forward f = collect(net, y);
  const auto predicted = predict_ready_order({y, scale}, f.params);
  ASSERT_FALSE(predicted.empty());
  EXPECT_EQ(f.names.at(predicted.front()), "scale");
  EXPECT_EQ(predicted.size(), f.params.size());
  EXPECT_EQ(names_of(f, predicted),
            names_of(f, observe_ready_order(f.params, y.sum() + scale.sum())));
}

// Outputs that carry no graph contribute nothing.
TEST(ReadyOrderOutputs, OutputsWithoutGradAreSkipped) {
  torch::manual_seed(0);
  const Forward f = net_forward();
  EXPECT_TRUE(predict_ready_order({at::Tensor(), torch::ones({2})}, f.params).empty());
  EXPECT_EQ(predict_ready_order({at::Tensor(), f.output}, f.params),
            predict_ready_order({f.output}, f.params));
}

// A tied tensor passed twice would be ambiguous (which index is "ready"?): refused, with the fix.
TEST(ReadyOrderErrors, DuplicateParameterIsRefused) {
  torch::manual_seed(0);
  const Forward f = tied_forward();
  std::vector<at::Tensor> twice = f.params;
  twice.push_back(f.params.front());
  try {
    predict_ready_order({f.output}, twice);
    FAIL() << "a parameter passed twice was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("deduplicated by TensorImpl"), std::string::npos)
        << e.what();
  }
}

// The engine facts the prediction rests on, checked against the libtorch we link.
TEST(ReadyOrderEngineFacts, AccumulatorsRunFirstAmongReadyNodes) {
  auto p = torch::ones({2}, torch::requires_grad());
  const auto acc = torch::autograd::impl::grad_accumulator(p);
  EXPECT_EQ(acc->sequence_nr(), UINT64_MAX);
  const auto a = p * 2;
  const auto b = a + 1;
  // Later forward ops get higher sequence numbers, so the engine runs them first.
  EXPECT_LT(a.grad_fn()->sequence_nr(), b.grad_fn()->sequence_nr());
}

}  // namespace
}  // namespace ddp::planner
