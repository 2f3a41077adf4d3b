// gradients::GradientRuntime on its own, without a wrapper around it: plain leaf tensors as the
// replicated parameters, rank-dependent gradients whose average is known in closed form, at world
// 1, 2 and 3 on Gloo. Every transition of its iteration state: idle -> prepared (synchronized) ->
// in backward -> idle with the averages written back; prepared (no_sync) -> a local backward
// that communicates nothing -> the next synchronized backward averages the sum; a gradient with
// no forward refused by name; reset() drops a prepared iteration; the listeners hear each event
// in order; a bucket per parameter launches in plan order. And DEFAULT's shape without its wrapper:
// a reduce-scattered unit (a stand-in storage) and all-reduced replicas in one runtime, launched
// interleaved in gradient-ready order under one bucket numbering, each reduced in closed form.

#include "ddp/gradients/gradient_runtime.hpp"

#include "ddp/gradients/unit_storage.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "support/error_text.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// The events, as text in arrival order: "started 1", "ready 0", "launched 1", "finished 1",
// "iteration 1".
struct EventLog : gradients::GradientListener {
  std::vector<std::string> events;
  void backward_started(const gradients::BackwardStarted& e) override {
    events.push_back("started " + std::to_string(e.iteration));
  }
  void grad_ready(size_t p, bool used) override {
    events.push_back("ready " + std::to_string(p) + (used ? "" : " unused"));
  }
  void bucket_launched(size_t b) override { events.push_back("launched " + std::to_string(b)); }
  void bucket_finished(const gradients::BucketFinished& e) override {
    events.push_back("finished " + std::to_string(e.bucket));
  }
  void backward_finished(int64_t i) override { events.push_back("iteration " + std::to_string(i)); }
};

// The loss whose gradient on parameter p is (rank + 1) * (p + 1) everywhere: sum of c * p.
torch::Tensor loss_of(const std::vector<torch::Tensor>& params, int rank) {
  torch::Tensor loss = torch::zeros({});
  for (size_t p = 0; p < params.size(); ++p) {
    loss = loss + params[p].sum() * static_cast<double>((rank + 1) * (p + 1));
  }
  return loss;
}

DDP_TEST_WORKER(gradient_runtime_transitions) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  // Two parameters, one bucket each (a cap below either's bytes): launched in plan order.
  std::vector<torch::Tensor> params = {torch::zeros({3}).requires_grad_(),
                                       torch::zeros({2, 2}).requires_grad_()};
  gradients::ReplicaParams replicas{params, {"a", "b"}, {}, {}};
  replicas.options.buckets.first_bucket_cap_bytes = 4;
  replicas.options.buckets.bucket_cap_bytes = 4;
  EventLog log;  // outlives the runtime
  gradients::GradientRuntime runtime(pg, {}, nullptr, replicas);
  runtime.add_listener(&log, "the test's log");
  require(runtime.plan().buckets.size() == 2, "one bucket per parameter");

  // idle: a gradient without a forward is refused by name.
  const std::string idle = error_of([&] { loss_of(params, r).backward(); });
  require(
      idle.rfind("ddp: a gradient for parameter '", 0) == 0 &&
          idle.find("no forward of the DistributedDataParallel module ran") != std::string::npos,
      "a backward in state idle: '" + idle + "'");
  for (auto& p : params) p.mutable_grad().reset();
  require(runtime.num_synchronized_backwards() == 0, "no synchronized backward yet");

  // prepared (synchronized) -> backward -> idle: the mean of (rank + 1) * (p + 1) over the ranks.
  const double mean_c = (w + 1) / 2.0;  // the mean of 1..w
  runtime.prepare_for_backward();
  require(error_of([&] { runtime.prepare_for_backward(); }).empty(),
          "a second forward before the backward re-prepares");
  log.events.clear();
  loss_of(params, r).backward();
  for (size_t p = 0; p < params.size(); ++p) {
    const double want = mean_c * static_cast<double>(p + 1);
    require(torch::allclose(params[p].grad(), torch::full_like(params[p], want), 1e-6, 0),
            "parameter " + std::to_string(p) + " averaged to " + std::to_string(want));
  }
  require(runtime.num_synchronized_backwards() == 1, "one synchronized backward");
  // The listeners: started, each gradient ready, its bucket launched, both finished at the end in
  // plan order, the iteration. (Gradients arrive in the engine's order, the same on every rank.)
  require(log.events.front() == "started 1" && log.events.back() == "iteration 1",
          "the events open and close the iteration");
  size_t launched = 0, finished = 0;
  for (const auto& e : log.events) {
    launched += e.rfind("launched ", 0) == 0;
    finished += e.rfind("finished ", 0) == 0;
  }
  require(launched == 2 && finished == 2, "two buckets launched and finished");

  // prepared (no_sync) -> a local backward: the local gradients add up, nothing is reduced; then a
  // synchronized backward averages the sum.
  for (auto& p : params) p.mutable_grad().zero_();
  runtime.prepare_for_local_backward();
  log.events.clear();
  loss_of(params, r).backward();
  for (size_t p = 0; p < params.size(); ++p) {
    const double local = static_cast<double>((r + 1) * (p + 1));
    require(torch::equal(params[p].grad(), torch::full_like(params[p], local)),
            "the local backward keeps rank " + std::to_string(r) + "'s own gradient");
  }
  require(log.events.empty(), "a local backward tells the listeners nothing");
  runtime.prepare_for_backward();
  loss_of(params, r).backward();
  for (size_t p = 0; p < params.size(); ++p) {
    const double want = 2 * mean_c * static_cast<double>(p + 1);
    require(torch::allclose(params[p].grad(), torch::full_like(params[p], want), 1e-6, 0),
            "no_sync then sync: the average of the sums for parameter " + std::to_string(p));
  }
  require(runtime.num_synchronized_backwards() == 2, "two synchronized backwards");

  // reset() drops a prepared iteration: a gradient now is refused as in idle.
  runtime.prepare_for_backward();
  runtime.reset();
  require(error_of([&] {
            loss_of(params, r).backward();
          }).rfind("ddp: a gradient for parameter", 0) == 0,
          "after reset the runtime is idle");
}

// A unit's storage as the sharded runtime would keep it, reduced to its arithmetic: one member of
// world * 2 elements, row k of the (world, 2) reduce input is its k-th pair, and this rank keeps
// its 2 elements of the average.
struct PairStorage : gradients::UnitStorage {
  explicit PairStorage(int world) : world(world) {}
  void fill_reduce_input(const at::Tensor& input, int64_t member,
                         const at::Tensor& incoming) override {
    require(member == 0 && incoming.defined(), "the unit's one member arrives in its hook");
    input.view({world, 2}).copy_(incoming.reshape({world, 2}));
  }
  void finish_reduce_scatter(const at::Tensor& reduced) override { shard = reduced.clone(); }
  int world;
  at::Tensor shard;
};

// What the sharded runtime hears, as text.
struct ObserverLog : gradients::UnitObserver {
  void backward_started() override { events.push_back("unit backward started"); }
  void unit_done(size_t group) override { events.push_back("unit done " + std::to_string(group)); }
  std::vector<std::string> events;
};

// DEFAULT's shape: reduce-scattered units and all-reduced replicas in one runtime, their buckets
// in one numbering (units first), launched interleaved in the order their gradients become ready.
DDP_TEST_WORKER(gradient_runtime_interleaved) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  // Registration order a, u, b; the loss is built a, u, b, so the engine (latest node first)
  // makes them ready b, u, a: a replica, the unit, a replica.
  std::vector<torch::Tensor> replicated = {torch::zeros({3}).requires_grad_(),
                                           torch::zeros({2, 2}).requires_grad_()};
  torch::Tensor member = torch::zeros({2 * w}).requires_grad_();
  PairStorage storage(w);
  gradients::ReduceUnit unit;
  unit.name = "u";
  unit.params = {member};
  unit.names = {"u.weight"};
  unit.offsets = {0};
  unit.row_numel = 2;
  unit.options = member.options().requires_grad(false);
  unit.storage = &storage;
  gradients::ReplicaParams replicas{replicated, {"a", "b"}, {}, {}};
  replicas.options.buckets.first_bucket_cap_bytes = 4;
  replicas.options.buckets.bucket_cap_bytes = 4;
  EventLog log;
  ObserverLog observer;
  gradients::GradientRuntime runtime(pg, {unit}, &observer, replicas);
  runtime.add_listener(&log, "the test's log");
  require(runtime.plan().buckets.size() == 3, "one unit bucket and two replica buckets");

  for (int step = 1; step <= 2; ++step) {
    for (auto& p : replicated) {
      if (p.grad().defined()) p.mutable_grad().zero_();  // in place: the bucket views stay
    }
    runtime.prepare_for_backward();
    log.events.clear();
    observer.events.clear();
    const double c = r + 1;  // the mean of c over the ranks: (w + 1) / 2
    torch::Tensor loss = replicated[0].sum() * c;
    loss = loss + member.sum() * (3 * c);
    loss = loss + replicated[1].sum() * (2 * c);
    loss.backward();
    const double mean_c = (w + 1) / 2.0;
    require(torch::allclose(replicated[0].grad(), torch::full({3}, mean_c), 1e-6, 0) &&
                torch::allclose(replicated[1].grad(), torch::full({2, 2}, 2 * mean_c), 1e-6, 0),
            "the replicas averaged, step " + std::to_string(step));
    require(storage.shard.defined() && storage.shard.numel() == 2 &&
                torch::allclose(storage.shard, torch::full({2}, 3 * mean_c), 1e-6, 0),
            "the unit's shard is this rank's pair of the average, step " + std::to_string(step));
    // In gradient-ready order across both kinds: replica b's bucket, the unit's (bucket 0: units
    // come first in the numbering), replica a's; each bucket finishes; the iteration closes.
    std::vector<std::string> launches;
    size_t finished = 0;
    for (const auto& e : log.events) {
      if (e.rfind("launched ", 0) == 0) launches.push_back(e);
      finished += e.rfind("finished ", 0) == 0;
    }
    const std::vector<std::string> want = {"launched 1", "launched 0", "launched 2"};
    std::string got;
    for (const auto& e : launches) got += e + "; ";
    require(launches == want, "launch order, step " + std::to_string(step) + ": " + got);
    require(finished == 3 && log.events.front() == "started " + std::to_string(step) &&
                log.events.back() == "iteration " + std::to_string(step),
            "every bucket finished inside the iteration, step " + std::to_string(step));
    std::string heard;
    for (const auto& e : observer.events) heard += e + "; ";
    require(observer.events == std::vector<std::string>{"unit backward started", "unit done 0"},
            "the sharded runtime heard the backward start and its unit done: " + heard);
  }
}

DDP_WORLD_SUITE(GradientRuntimeTest, 1, 2, 3);

DDP_WORKER_TEST_P(GradientRuntimeTest, UnitsAndReplicasInterleaveInOneNumbering,
                  gradient_runtime_interleaved);

DDP_WORKER_TEST_P(GradientRuntimeTest, EveryTransitionOfOneIteration, gradient_runtime_transitions);

}  // namespace
}  // namespace ddp::testing
