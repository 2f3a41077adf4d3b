// The one autograd-graph walk against the three questions asked of it: which parameters the
// outputs reach, the order their gradients become ready, and the DOT dump. Closed-form answers on
// hand-built graphs small enough to count by hand.

#include "ddp/planner/autograd_graph.hpp"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/planner/graph_dot.hpp"
#include "ddp/planner/reachability.hpp"
#include "ddp/planner/ready_order.hpp"
#include "support/test_nets.hpp"

namespace ddp::planner {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// y = a * 2 + b * b, with c registered but unused:
//
//   AddBackward            <- the root edge
//     MulBackward (a * 2)  -> AccumulateGrad(a)
//     MulBackward (b * b)  -> AccumulateGrad(b), twice: b is used twice
//
// 5 nodes and 6 counted edges (the root's, 2 from Add, 1 from a * 2, 2 from b * b): every node
// waits for one edge except b's accumulator, which waits for 2.
struct SmallGraph {
  at::Tensor a = torch::ones({2}, torch::requires_grad());
  at::Tensor b = torch::full({2}, 3.0, torch::requires_grad());
  at::Tensor c = torch::ones({4}, torch::requires_grad());
  std::vector<at::Tensor> params = {a, b, c};
  std::vector<std::string> names = {"w_a", "w_b", "w_c"};
  // Members are initialized in this order, so a * 2 is recorded before b * b (the operands of one
  // `+` expression would be evaluated in an unspecified order).
  at::Tensor a_times_2 = a * 2;
  at::Tensor b_squared = b * b;
  at::Tensor y = a_times_2 + b_squared;
};

TEST(AutogradGraph, OneWalkCountsNodesEdgesAndParameters) {
  SmallGraph g;
  const AutogradGraph graph({g.y}, ParamIndex(g.params));
  ASSERT_EQ(graph.size(), 5u);
  EXPECT_EQ(graph.num_params(), 3u);
  ASSERT_EQ(graph.roots().size(), 1u);
  EXPECT_EQ(graph.roots()[0].function.get(), g.y.grad_fn().get());
  EXPECT_EQ(graph.nodes()[0], g.y.grad_fn().get());  // discovery order starts at the root
  const auto& deps = graph.dependencies();
  EXPECT_EQ(std::accumulate(deps.begin(), deps.end(), 0u), 6u);

  std::vector<size_t> params_seen;
  for (size_t id = 0; id < graph.size(); ++id) {
    EXPECT_EQ(graph.id_of(graph.nodes()[id]), id);
    const size_t param = graph.param_of()[id];
    if (param == ParamIndex::kNone) {
      EXPECT_EQ(deps[id], 1u) << graph.nodes()[id]->name();
      continue;
    }
    params_seen.push_back(param);
    EXPECT_EQ(deps[id], param == 1 ? 2u : 1u) << "param " << param;
  }
  std::sort(params_seen.begin(), params_seen.end());
  EXPECT_EQ(params_seen, (std::vector<size_t>{0, 1}));  // c has no accumulator in the graph
}

TEST(AutogradGraph, ReachabilityReadyOrderAndDotComeFromTheSameWalk) {
  SmallGraph g;
  const AutogradGraph graph({g.y}, ParamIndex(g.params));

  EXPECT_EQ(reachable_params(graph), (std::vector<bool>{true, true, false}));
  // Add releases a * 2 and b * b together; b * b is the later forward op (higher sequence
  // number), so it runs first and releases b's accumulator, which runs before a * 2.
  EXPECT_EQ(predict_ready_order(graph), (std::vector<size_t>{1, 0}));

  const std::string dot = graph_dot(graph, g.names);
  EXPECT_EQ(dot.rfind("digraph autograd {", 0), 0u) << dot;
  EXPECT_EQ(count(dot, " [label=\""), 3u) << dot;  // Add and the two Muls
  EXPECT_EQ(count(dot, "[shape=box"), 2u) << dot;  // the two reached parameters
  EXPECT_EQ(count(dot, "label=\"w_a\\n[2]\""), 1u) << dot;
  EXPECT_EQ(count(dot, "label=\"w_b\\n[2]\""), 1u) << dot;
  EXPECT_EQ(count(dot, "w_c"), 0u) << dot;
  EXPECT_EQ(count(dot, " -> "), 5u) << dot;  // the 6 counted edges less the root's
  EXPECT_NE(dot.find("  n0 [label=\"AddBackward0\"];"), std::string::npos) << dot;

  // The tensor-level entry points are the same walk: same answers, byte for byte the same DOT.
  EXPECT_EQ(reachable_params({g.y}, g.params), reachable_params(graph));
  EXPECT_EQ(predict_ready_order({g.y}, g.params), predict_ready_order(graph));
  EXPECT_EQ(autograd_graph_dot(g.y, g.params, g.names), dot);

  // Reading the graph consumed nothing: backward still runs, with the closed-form gradients.
  g.y.sum().backward();
  EXPECT_TRUE(g.a.grad().equal(torch::full({2}, 2.0)));
  EXPECT_TRUE(g.b.grad().equal(torch::full({2}, 6.0)));
  EXPECT_FALSE(g.c.grad().defined());
}

// A parameter returned as an output is its own root: reachable, and ready before anything else.
TEST(AutogradGraph, ParameterReturnedAsOutputIsARoot) {
  SmallGraph g;
  const AutogradGraph graph({g.y, g.c}, ParamIndex(g.params));
  EXPECT_EQ(graph.size(), 6u);
  EXPECT_EQ(graph.roots().size(), 2u);
  EXPECT_EQ(reachable_params(graph), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(predict_ready_order(graph), (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(count(graph_dot(graph, g.names), "label=\"w_c\\n[4]\""), 1u);
}

// An input that requires grad but is no parameter ends in an accumulator of its own: in the walk,
// drawn as "leaf", but no parameter's.
TEST(AutogradGraph, LeafThatIsNoParameterIsWalkedButIndexesNothing) {
  SmallGraph g;
  const auto x = torch::ones({2}, torch::requires_grad());
  const auto z = x * g.a;
  const AutogradGraph graph({z}, ParamIndex(g.params));
  EXPECT_EQ(graph.size(), 3u);  // Mul, x's accumulator, a's accumulator
  EXPECT_EQ(reachable_params(graph), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(predict_ready_order(graph), (std::vector<size_t>{0}));
  const std::string dot = graph_dot(graph, g.names);
  EXPECT_EQ(count(dot, "label=\"leaf\\n[2]\""), 1u) << dot;
  EXPECT_EQ(count(dot, "label=\"w_a\\n[2]\""), 1u) << dot;
}

// Outputs without a graph (undefined, or not requiring grad) give an empty walk.
TEST(AutogradGraph, OutputsWithoutGradGiveAnEmptyWalk) {
  SmallGraph g;
  const AutogradGraph graph({at::Tensor(), torch::ones({2})}, ParamIndex(g.params));
  EXPECT_EQ(graph.size(), 0u);
  EXPECT_TRUE(graph.roots().empty());
  EXPECT_EQ(reachable_params(graph), (std::vector<bool>{false, false, false}));
  EXPECT_TRUE(predict_ready_order(graph).empty());
  EXPECT_EQ(count(graph_dot(graph, g.names), "label="), 0u);
}

// A parameter used by a module's forward and one it never calls: the net the reducer's
// find_unused_parameters is tested on.
TEST(AutogradGraph, UnusedBranchOfAModuleIsUnreachable) {
  torch::manual_seed(0);
  ddp::testing::UnusedBranchNet net(8);
  const auto y = net->forward(torch::randn({3, 8}));
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : net->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  ASSERT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "unused.weight", "unused.bias"}));
  EXPECT_EQ(reachable_params({y}, params),
            (std::vector<bool>{true, true, true, true, false, false}));
}

// A tied weight passed twice is refused by every entry point, naming both indices and the fix.
TEST(AutogradGraph, TiedWeightsAreRefused) {
  SmallGraph g;
  const std::vector<at::Tensor> twice = {g.a, g.b, g.a};
  const std::string tail =
      ": params[2] is the same tensor as params[0] (a tied weight?); pass each parameter once, "
      "deduplicated by TensorImpl";
  auto message = [](const auto& call) -> std::string {
    try {
      call();
    } catch (const c10::Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message([&] { reachable_params({g.y}, twice); }).find("reachable_params" + tail),
            std::string::npos);
  EXPECT_NE(message([&] { predict_ready_order({g.y}, twice); }).find("predict_ready_order" + tail),
            std::string::npos);
  EXPECT_NE(
      message([&] { autograd_graph_dot(g.y, twice, g.names); }).find("autograd_graph_dot" + tail),
      std::string::npos);
  EXPECT_NE(message([&] { ParamIndex index(twice); }).find("ddp::planner" + tail),
            std::string::npos);
  const std::vector<at::Tensor> undefined = {g.a, at::Tensor()};
  EXPECT_NE(message([&] { ParamIndex index(undefined, "x"); }).find("x: params[1] is undefined"),
            std::string::npos);
}

}  // namespace
}  // namespace ddp::planner
