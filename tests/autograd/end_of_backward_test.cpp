// The one end-of-backward callback (autograd/end_of_backward.hpp): requests made inside one
// backward run once it ends, before backward() returns, in the order asked; a backward that fails
// drops its list and the next backward's requests still run; a function that throws does not stop
// the others, and its error is backward's; a list belongs to its graph task: two backwards at once
// on two threads keep two lists, a backward inside a node's backward keeps its own unless the node
// holds a NestedBackward.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
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

TEST(EndOfBackward, OutsideABackwardIsAnErrorByName) {
  EXPECT_EQ(error_of([] { autograd::at_end_of_backward([] {}); }),
            "ddp: at_end_of_backward was called outside a backward (from a hook or a node's "
            "backward only)");
}

// A node whose backward runs a backward of its own over another graph (a reentrant, nested graph
// task): with `nested`, under a NestedBackward.
std::vector<std::string> nested_run(bool nested) {
  std::vector<std::string> ran;
  const auto x = torch::ones({2}, torch::requires_grad());
  const auto z = torch::ones({2}, torch::requires_grad());
  const auto y = traced(
      x,
      [&] {
        autograd::at_end_of_backward([&] { ran.push_back("outer's request"); });
        torch::AutoGradMode grad_mode(true);  // a node's backward runs without it, as a recompute
        const auto inner = traced(
            z,
            [&] {
              autograd::at_end_of_backward([&] { ran.push_back("inner's request"); });
              ran.push_back("inner node");
            },
            [] {});
        if (nested) {
          autograd::NestedBackward scope;
          inner.sum().backward();
        } else {
          inner.sum().backward();
        }
        ran.push_back("outer node");
      },
      [] {});
  y.sum().backward();
  EXPECT_TRUE(torch::equal(z.grad(), torch::full({2}, 2.0)));
  return ran;
}

TEST(EndOfBackward, ANestedBackwardKeepsItsOwnListUnlessTheNodeJoinsItToTheOuterOne) {
  EXPECT_EQ(nested_run(false), (std::vector<std::string>{"inner node", "inner's request",
                                                         "outer node", "outer's request"}));
  EXPECT_EQ(nested_run(true), (std::vector<std::string>{"inner node", "outer node",
                                                        "outer's request", "inner's request"}));
}

TEST(EndOfBackward, TwoBackwardsAtOnceOnTwoThreadsEachRunTheirOwnList) {
  // Backward A asks, then waits inside its node until backward B has asked too: both lists are
  // open at once. Each request must run at the end of its own backward, on that backward's thread.
  std::mutex mutex;
  std::condition_variable changed;
  bool a_asked = false, b_asked = false, timed_out = false;
  std::vector<std::pair<std::string, std::thread::id>> ran;
  const auto wait_for = [&](const bool& flag) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!changed.wait_for(lock, std::chrono::seconds(30), [&] { return flag; })) timed_out = true;
  };
  const auto ask = [&](const char* name, bool& flag) {
    autograd::at_end_of_backward([&, name] {
      std::lock_guard<std::mutex> lock(mutex);
      ran.emplace_back(name, std::this_thread::get_id());
    });
    {
      std::lock_guard<std::mutex> lock(mutex);
      flag = true;
    }
    changed.notify_all();
  };
  std::thread::id thread_a, thread_b;
  std::thread a([&] {
    thread_a = std::this_thread::get_id();
    const auto x = torch::ones({2}, torch::requires_grad());
    traced(
        x,
        [&] {
          ask("A", a_asked);
          wait_for(b_asked);
        },
        [] {})
        .sum()
        .backward();
  });
  std::thread b([&] {
    thread_b = std::this_thread::get_id();
    const auto x = torch::ones({2}, torch::requires_grad());
    traced(
        x,
        [&] {
          wait_for(a_asked);
          ask("B", b_asked);
        },
        [] {})
        .sum()
        .backward();
  });
  a.join();
  b.join();
  ASSERT_FALSE(timed_out);
  ASSERT_EQ(ran.size(), 2u);
  std::sort(ran.begin(), ran.end());
  EXPECT_EQ(ran[0], std::make_pair(std::string("A"), thread_a));
  EXPECT_EQ(ran[1], std::make_pair(std::string("B"), thread_b));
}

}  // namespace
}  // namespace ddp::testing
