#pragma once
// ReplicaBuckets: the replicated parameters' buckets (DDP, and DEFAULT's parameters that stay
// whole), all-reduced: one reduce strategy of the GradientRuntime (reduce_strategy.hpp), which
// keeps the one iteration state and calls this under its lock. Each concern lives in its own piece:
//   AutogradHooks   accumulator post-hooks (autograd_hooks.hpp)
//   BucketStorage      flat storage per bucket and each parameter's slot in it (buckets/)
//   BucketRuntime   counts ready gradients, launches and finishes the all-reduces (bucket_runtime)
//   UnusedParams    reachability, the used-parameter map, static_graph's record (unused_params)
// What stays here: the plan's life cycle (initial, predicted, rebuilt from the observed order),
// moving gradients into their slots and the averaged ones back to param.grad.
//
// Invariants (docs/design/invariants.md):
//  - Equivalence: after a synchronized backward, every parameter's grad equals the average over
//    ranks of the local gradients (for a batch-mean loss: the gradient of the global batch).
//  - Buckets are launched strictly in plan order, the same on every rank (collectives must match),
//    and a bucket is launched the moment its last gradient is ready, never earlier.
//  - The plan changes at most at two points, both collective: the first forward (graph planning)
//    or the end of the first synchronized backward (rebuild from rank 0's observed order).
//
// Timeline of one synchronized step (two buckets, b0 holds the last layer):
//
//   forward ........ | backward: grads fc4 fc3 | fc2 fc1 | callback: finish b0, b1
//   comm                     allreduce(b0) --->|allreduce(b1) --->|
//                            ^ b0 full              ^ b1 full
//   finish = wait, write the averaged gradients back, tell the listeners (optimizer in backward)
//
// [Note: streams] On CUDA the reducer launches no kernel of its own on a side stream and never
// synchronizes the device. Gradients are copied into their bucket on the stream that produced them
// (the autograd engine's current stream for the device). ProcessGroupNCCL runs each all-reduce on
// its own communication stream after an event recorded on that compute stream, so the reduction
// starts when the bucket's last gradient is written, while the compute stream goes on with the
// rest of backward. Finishing makes the compute stream wait on the all-reduce's end event
// (ProcessGroup::wait_on_stream), at the end of backward or, with a listener that wants early
// finishes, only for buckets whose event has already fired (Work::isCompleted polls it): compute
// never waits on communication it does not consume.
//
//   compute  |bwd fc4|copy|bwd fc3..fc2|copy|bwd fc1|copy|   wait(e0) wait(e1) wait(e2)|optimizer
//   nccl            \__allreduce b0__/   \__allreduce b1__/  \__ b2 __/
//                   ^ event: b0 written   (each all-reduce records an end event e_b)
//
// Host-side work per gradient, on the autograd thread (what a CUDA-graph capture must do without):
// the runtime's mutex, the state checks, one comparison of param.grad with its slot (a copy only
// when they differ), the bucket counter (BucketRuntime), one virtual call per listener, and with
// find_unused_parameters a write into the host-side used map. Per iteration: one engine callback,
// one steady-clock read in prepare_for_backward, and with the used map one device-to-host copy.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/buckets/bucket_storage.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/gradients/autograd_hooks.hpp"
#include "ddp/gradients/bucket_runtime.hpp"
#include "ddp/gradients/gradient_options.hpp"
#include "ddp/gradients/reduce_strategy.hpp"
#include "ddp/gradients/unused_params.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::gradients {

// The replicated parameters as the GradientRuntime is given them.
struct ReplicaParams {
  std::vector<at::Tensor> params;  // distinct, require grad, registration order
  std::vector<std::string> names;  // their qualified names
  GradientOptions options;
  // expect_sparse[i]: parameter i produces sparse gradients (Embedding with sparse=true); it gets
  // a bucket of its own and is reduced as sparse. Empty: none.
  std::vector<bool> expect_sparse;
};

class ReplicaBuckets final : public ReduceStrategy {
 public:
  // Installs a post-hook on each parameter's gradient accumulator: `on_ready(i)` runs after
  // parameter i's gradient was accumulated (the GradientRuntime's entry point).
  ReplicaBuckets(ReplicaParams replicas, comm::ProcessGroupPtr pg,
                 std::function<void(size_t)> on_ready,
                 const std::vector<GradientListener*>& listeners);
  ~ReplicaBuckets() override;

  const std::vector<at::Tensor>& params() const override { return params_; }
  const std::vector<std::string>& names() const override { return names_; }
  const std::vector<buckets::ParamSpec>& specs() const override { return specs_; }
  const buckets::BucketPlan& plan() const override { return plan_; }
  const char* builtin_reduction() const override { return "allreduce"; }

  void make_runtime(const hooks::CommHookPtr& hook, int64_t plan_epoch) override;
  // Refuses a capture it cannot be in, takes the forward's reachability (empty: every
  // parameter), drops gradients a failed backward staged. The plan does not change here.
  bool prepare(const std::vector<bool>& reachable, const std::vector<size_t>& unit_order) override;
  void follow_current_stream() override { autograd_hooks_->follow_current_stream(); }

  // The first event of a synchronized backward: the used map's collective (every rank at the same
  // point, before any bucket), unused parameters counted ready. Nothing for a local one.
  void start_backward(bool sync, int64_t num_sync_backwards) override;
  std::string gradient_without_forward(size_t index) const override;
  // Parameter `index`'s gradient is final. Synchronized: it joins its bucket (launched when
  // full), and with `early_finish` the buckets whose reduction completed are finished; local:
  // only its use is marked (find_unused_parameters under no_sync).
  int64_t gradient_ready(size_t index, const at::Tensor& incoming,
                         const GradientArrival& arrival) override;
  // Launches what overlap left, finishes every bucket, then throws for a failure or for
  // parameters that got no gradient.
  void finish_backward(int64_t num_sync_backwards) override;
  void succeeded(int64_t num_sync_backwards) override;
  // After the first synchronized backward without graph planning: rank 0's observed order.
  bool rebuild_once() override;
  void reset() override;

  bool needs_walk(int64_t num_sync_backwards) const override;
  // True until the first forward has settled the plan (prediction or reverse order).
  bool awaiting_plan() const override { return !planned_; }
  // Graph planning: rank 0's predicted order (completed, broadcast) before the first backward.
  std::optional<bool> set_predicted_order(const std::vector<size_t>& predicted) override;
  bool joins() const override { return true; }
  void set_divisor(int64_t divisor) override { divisor_ = divisor; }
  // Join: the collectives of a synchronized backward, over zeros.
  void shadow(int64_t num_sync_backwards) override;

  // Undefined while the bucket was never needed (in-place reduction allocates it lazily).
  const at::Tensor& bucket_buffer(size_t b) const override { return storage_->storage(b); }
  const GradientOptions& options() const { return options_; }

 private:
  void refuse_capture_if_host_bound() const;
  bool build_plan(const std::vector<size_t>& order);
  std::vector<size_t> agree_on_order(std::vector<size_t> order, const std::string& what);
  void mark_ready(size_t index, bool used);
  void finish_buckets(bool only_completed);
  void write_back(const BucketRuntime::Finished& finished);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  comm::ProcessGroupPtr pg_;
  GradientOptions options_;
  // GradientOptions::reduce_in_place as decided for this group's backend (unset: NCCL's way).
  bool in_place_;

  // The plan and what executes it. runtime_ refers to plan_ and *storage_: build_plan drops it,
  // and the GradientRuntime makes the new one (make_runtime) before the next backward.
  buckets::BucketPlan plan_;
  std::vector<size_t> plan_order_;  // the order plan_ was built from
  std::unique_ptr<buckets::BucketStorage> storage_;
  std::unique_ptr<BucketRuntime> runtime_;

  UnusedParams unused_;
  bool planned_ = false;                // graph planning or reverse order has been settled
  bool rebuilt_ = false;                // the post-iteration-1 rebuild is done (or not needed)
  std::vector<size_t> observed_order_;  // this iteration's ready order (for the rebuild)
  std::vector<bool> ready_;             // per parameter, this iteration; reset at reset()
  // Pre-backward grads of locally unused parameters, restored if no rank used them.
  std::vector<at::Tensor> saved_unused_grads_;
  int64_t divisor_ = 0;  // 0: the world size

  // Last member: its destructor removes the hooks before anything they use is destroyed.
  std::unique_ptr<AutogradHooks> autograd_hooks_;
};

}  // namespace ddp::gradients
