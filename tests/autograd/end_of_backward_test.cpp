// The one end-of-backward callback (autograd/end_of_backward.hpp): requests made inside one
// backward run once it ends, before backward() returns, in the order asked; a backward that fails
// drops its list and the next backward's requests still run; a function that throws does not stop
// the others, and its error is backward's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/autograd/backward_node.hpp"
#include "ddp/autograd/end_of_backward.hpp"
#include "support/error_text.hpp"

namespace ddp::testing {
namespace {

// y = x * 2 with nodes on it: `first` runs when the gradient reaches the outer node, `second`
// when it reaches the inner one (after the first).
torch::Tensor traced(const torch::Tensor& x, std::function<void()> first,
                     std::function<void()> second) {
  return autograd::on_backward(autograd::on_backward(x * 2, std::move(second)), std::move(first));
}

TEST(EndOfBackward, RequestsOfOneBackwardRunOnceAtItsEndInTheOrderAsked) {
  const auto x = torch::ones({3}, torch::requires_grad());
  std::vector<std::string> ran;
  const auto y = traced(
      x,
      [&] {
        autograd::at_end_of_backward([&] { ran.push_back("a"); });
        autograd::at_end_of_backward([&] { ran.push_back("b"); });
        ran.push_back("node 1");
      },
      [&] {
        autograd::at_end_of_backward([&] { ran.push_back("c"); });
        ran.push_back("node 2");
      });
  y.sum().backward();
  EXPECT_EQ(ran, (std::vector<std::string>{"node 1", "node 2", "a", "b", "c"}));
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 2.0)));
  // The next backward starts a new list: only its own request runs.
  ran.clear();
  traced(
      x, [&] { autograd::at_end_of_backward([&] { ran.push_back("d"); }); }, [] {})
      .sum()
      .backward();
  EXPECT_EQ(ran, (std::vector<std::string>{"d"}));
}

TEST(EndOfBackward, AFailedBackwardDropsItsListAndTheNextOneStillRuns) {
  const auto x = torch::ones({2}, torch::requires_grad());
  std::vector<std::string> ran;
  const auto failing = traced(
      x, [&] { autograd::at_end_of_backward([&] { ran.push_back("of the failed backward"); }); },
      [] { TORCH_CHECK(false, "node failed"); });
  const std::string error = error_of([&] { failing.sum().backward(); });
  EXPECT_NE(error.find("node failed"), std::string::npos) << error;
  EXPECT_TRUE(ran.empty());
  traced(
      x, [&] { autograd::at_end_of_backward([&] { ran.push_back("next"); }); }, [] {})
      .sum()
      .backward();
  EXPECT_EQ(ran, (std::vector<std::string>{"next"}));
}

TEST(EndOfBackward, AThrowingFunctionLetsTheOthersRunAndIsBackwardsError) {
  const auto x = torch::ones({2}, torch::requires_grad());
  std::vector<std::string> ran;
  const auto y = traced(
      x,
      [&] {
        autograd::at_end_of_backward([] { TORCH_CHECK(false, "first failed"); });
        autograd::at_end_of_backward([&] { ran.push_back("second"); });
      },
      [] {});
  const std::string error = error_of([&] { y.sum().backward(); });
  EXPECT_NE(error.find("first failed"), std::string::npos) << error;
  EXPECT_EQ(ran, (std::vector<std::string>{"second"}));
}

}  // namespace
}  // namespace ddp::testing
