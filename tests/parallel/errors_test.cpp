#include <gtest/gtest.h>

#include <torch/torch.h>
#include <unistd.h>

#include "ddp/comm/init.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void require_contains(const std::string& text, const std::string& part, const std::string& what) {
  require(text.find(part) != std::string::npos,
          what + ": expected the error to contain \"" + part + "\", got \"" + text + "\"");
}

// A parameter without a gradient and no find_unused_parameters: every rank gets an error naming
// it and the flag, at the end of that backward, and no rank hangs.
DDP_TEST_WORKER(unused_without_flag) {
  auto pg = worker_process_group();
  auto w = make_test_workload("unused-branch");
  parallel::DistributedDataParallel<torch::nn::AnyModule> model(w.module, pg);
  auto [x, y] = w.batch(0, 4);
  const std::string error = message_of([&] { w.loss(model(x), y).backward(); });
  require_contains(error,
                   "2 parameter(s) received no gradient in this backward: unused.weight, "
                   "unused.bias",
                   "unused parameter");
  require_contains(error, "find_unused_parameters = true", "unused parameter");
  // The next iteration works with the flag (state was reset, collectives still matched).
  pg->barrier("after the error");
}

TEST(Errors, UnusedParameterWithoutTheFlagIsNamed) {
  for (int world : {1, 2}) {
    EXPECT_WORKERS_PASS(run_workers(unused_without_flag, world));
  }
}

DDP_TEST_WORKER(backward_twice) {
  auto pg = worker_process_group();
  auto w = models::make_workload("net", {16});
  parallel::DistributedDataParallel<torch::nn::AnyModule> model(w.module, pg);
  auto [x, y] = w.batch(0, 4);
  auto loss = w.loss(model(x), y);
  loss.backward({}, /*retain_graph=*/true);
  const std::string error = message_of([&] { loss.backward(); });
  require_contains(error,
                   "no forward of the DistributedDataParallel module ran since the last "
                   "backward",
                   "backward twice");
}

TEST(Errors, BackwardTwiceWithoutForward) { EXPECT_WORKERS_PASS(run_workers(backward_twice, 2)); }

// Rank 1 dies after its forward; rank 0's backward must fail within its 3 s collective timeout
// (or sooner, when Gloo sees the closed connection) with a message naming the bucket and timeout.
DDP_TEST_WORKER(dead_rank) {
  auto pg = worker_process_group(std::chrono::seconds(3));
  auto w = models::make_workload("net", {16});
  parallel::DistributedDataParallel<torch::nn::AnyModule> model(w.module, pg);
  auto [x, y] = w.batch(pg->rank() * 4, 4);
  auto loss = w.loss(model(x), y);
  if (pg->rank() == 1) ::_exit(0);  // dies mid-step, as a crashed worker would
  const auto start = std::chrono::steady_clock::now();
  const std::string error = message_of([&] { loss.backward(); });
  require_contains(error, "reduction of gradient bucket 0", "dead rank");
  require_contains(error, "collective timeout 3000 ms", "dead rank");
  require(std::chrono::steady_clock::now() - start < std::chrono::seconds(30),
          "dead rank: the failure took longer than the bound");
}

TEST(Errors, DeadRankFailsTheSurvivorsWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_WORKERS_PASS(run_workers(dead_rank, 2, {}, {}, std::chrono::seconds(90)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

DDP_TEST_WORKER(bad_options) {
  auto pg = worker_process_group();
  auto w = models::make_workload("net", {16});
  parallel::DDPOptions options;
  options.gradients.buckets.bucket_cap_bytes = 0;
  const std::string error = message_of(
      [&] { parallel::DistributedDataParallel<torch::nn::AnyModule> m(w.module, pg, options); });
  require_contains(error, "bucket caps must be positive (first 1048576 B, later 0 B)",
                   "bad option");
}

TEST(Errors, BadOptionIsNamed) { EXPECT_WORKERS_PASS(run_workers(bad_options, 1)); }

TEST(Errors, UnknownBackendIsNamed) {
  comm::InitOptions options;
  options.backend = "mpi";
  options.world = comm::WorldInfo{0, 1, 0, "127.0.0.1", 0};
  options.world->master_port = launch::find_free_port();
  try {
    comm::init_process_group(options);
    FAIL() << "backend mpi must be refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'mpi': expected 'gloo' or 'nccl'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::testing
