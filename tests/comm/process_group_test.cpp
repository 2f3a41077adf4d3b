#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

DDP_TEST_WORKER(collectives) {
  auto pg = worker_process_group();
  const int n = pg->world_size();
  const int r = pg->rank();
  // Closed forms: sum of ranks = n(n-1)/2; broadcast gives the root's value; allgather gives
  // every rank's value in rank order.
  auto t = torch::full({5}, static_cast<float>(r));
  pg->allreduce_sum(t, "test all-reduce");
  require(t.eq(n * (n - 1) / 2.0f).all().item<bool>(), "all-reduce sum of ranks is wrong");
  auto b = torch::full({3}, static_cast<float>(10 + r));
  pg->broadcast(b, n - 1, "test broadcast");
  require(b.eq(10.0f + n - 1).all().item<bool>(), "broadcast from the last rank is wrong");
  auto gathered =
      pg->all_gather_each(torch::full({2}, static_cast<float>(r * r)), "test allgather");
  require(static_cast<int>(gathered.size()) == n, "allgather returned the wrong count");
  for (int i = 0; i < n; ++i) {
    require(gathered[i].eq(static_cast<float>(i * i)).all().item<bool>(), "allgather slot wrong");
  }
  pg->barrier("test barrier");

  // Bytes sent, each collective counted as a ring sends it (CollectiveOp::wire_bytes): 6 floats,
  // 24 bytes; Gloo 1.13 emulates the reduce-scatter by an all-reduce.
  const auto sent = [&](const std::function<void()>& fn) {
    const int64_t before = pg->bytes_sent();
    fn();
    return pg->bytes_sent() - before;
  };
  auto six = torch::ones({6});
  const int64_t reduce_scatter_rings = pg->backend_traits().flat_collectives ? 1 : 2;
  const std::vector<std::pair<std::string, int64_t>> counted = {
      {"all-reduce", sent([&] { pg->allreduce_sum(six, "bytes all-reduce"); })},
      {"broadcast", sent([&] { pg->broadcast(six, 0, "bytes broadcast"); })},
      {"all-gather", sent([&] { pg->all_gather_each(six, "bytes all-gather"); })},
      {"reduce-scatter",
       sent([&] { pg->reduce_scatter(six, comm::ReduceOp::kSum, "bytes reduce-scatter"); })},
      {"barrier", sent([&] { pg->barrier("bytes barrier"); })}};
  const std::vector<int64_t> want = {2 * (n - 1) * 24 / n, n > 1 ? 24 : 0, (n - 1) * 24,
                                     reduce_scatter_rings * (n - 1) * 24 / n, 0};
  for (size_t i = 0; i < want.size(); ++i) {
    require(counted[i].second == want[i], counted[i].first + " counted " +
                                              std::to_string(counted[i].second) +
                                              " bytes sent, want " + std::to_string(want[i]));
  }
}

DDP_WORKER_TEST_PER_WORLD(Collectives, ClosedFormResults, collectives, 1, 2, 3);

// Rank 1 stays alive but never joins the all-reduce; rank 0 must fail within its 2 s timeout
// with a message that says so, then release rank 1 through the store.
DDP_TEST_WORKER(collective_timeout) {
  auto pg = worker_process_group(std::chrono::seconds(2));
  if (pg->rank() == 1) {
    // Returns when rank 0 sets the key; bounded, and longer than rank 0's 2 s collective timeout.
    pg->store().wait({"test/release"}, std::chrono::seconds(60));
    return;
  }
  auto t = torch::ones({4});
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    pg->allreduce_sum(t, "test all-reduce");
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  pg->store().set("test/release", std::vector<uint8_t>{1});
  require(!error.empty(), "all-reduce without a peer did not fail");
  require(error.find("test all-reduce failed on rank 0 of 2 (collective timeout 2000 ms") !=
              std::string::npos,
          "error does not name the collective and timeout: " + error);
  require(waited < std::chrono::seconds(30), "the timeout was not honoured");
  // One line: torch's backtrace of the underlying failure stays in the flight dump (issue 62).
  require(error.find("Exception raised from") == std::string::npos &&
              error.find("frame #") == std::string::npos,
          "the error carries torch's backtrace: " + error);
}

TEST(ProcessGroup, CollectiveTimesOutWithANamedError) {
  EXPECT_WORKERS_PASS(run_workers(collective_timeout, 2, {}, {}, std::chrono::seconds(60)));
}

}  // namespace
}  // namespace ddp::testing
