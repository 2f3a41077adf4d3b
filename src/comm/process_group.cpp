#include "ddp/comm/process_group.hpp"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace ddp::comm {

ProcessGroup::ProcessGroup(c10::intrusive_ptr<detail::CollectiveBackend> backend,
                           c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           std::string backend_name, std::chrono::milliseconds timeout,
                           c10::intrusive_ptr<c10d::Store> progress_store)
    : backend_(std::move(backend)),
      store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      backend_name_(std::move(backend_name)),
      timeout_(timeout) {
  TORCH_CHECK(backend_, "ddp: ProcessGroup needs a c10d backend");
  TORCH_CHECK(world_size_ >= 1 && rank_ >= 0 && rank_ < world_size_, "ddp: rank ", rank_,
              " is outside world size ", world_size_);
  long interval_ms = 1000;
  if (const char* text = std::getenv("DDP_HEARTBEAT_MS")) interval_ms = std::atol(text);
  TORCH_CHECK(interval_ms > 0, "ddp: DDP_HEARTBEAT_MS must be a positive number of ms, got '",
              std::getenv("DDP_HEARTBEAT_MS"), "'");
  progress_ = std::make_unique<CollectiveProgress>(std::move(progress_store), rank_, world_size_,
                                                   std::chrono::milliseconds(interval_ms));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::issued(c10::intrusive_ptr<c10d::Work> work,
                                                    const CollectiveOp& op) {
  progress_->issued(work.get(), op);
  return work;
}

ProcessGroup::~ProcessGroup() {
  if (!shutdown_) return;
  try {
    shutdown_();
  } catch (const std::exception& e) {
    // A destructor must not throw; the process is ending its use of the group anyway.
    std::fprintf(stderr, "ddp: shutting down the %s process group failed: %s\n",
                 backend_name_.c_str(), e.what());
  }
}

bool ProcessGroup::can_sum(at::ScalarType dtype) const {
  return !(backend_name_ == "gloo" && dtype == at::kBFloat16);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_sum_async(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  return issued(backend_->allreduce(tensors, opts),
                {"all-reduce (sum)", tensor.numel(), tensor.scalar_type()});
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_avg_async(at::Tensor& tensor) {
  if (!reduces_avg()) {
    tensor.div_(world_size_);
    return allreduce_sum_async(tensor);
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::AVG;
  opts.timeout = timeout_;
  return issued(backend_->allreduce(tensors, opts),
                {"all-reduce (average)", tensor.numel(), tensor.scalar_type()});
}

void ProcessGroup::wait_on_stream(const c10::intrusive_ptr<c10d::Work>& work,
                                  const std::string& what) const {
  if (backend_name_ != "nccl") {
    wait(work, what);
    return;
  }
  try {
    work->wait();  // no timeout argument: a stream dependency, not a host wait
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "ddp: ", what, " failed on rank ", rank_, " of ", world_size_,
                " (collective timeout ", timeout_.count(), " ms", progress_->report(work.get()),
                "): ", e.what());
  }
  progress_->done(work.get());
}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
  // Work::wait rethrows the collective's own failure (e.g. a peer closed its connection) and
  // throws once the timeout passes.
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "ddp: ", what, " failed on rank ", rank_, " of ", world_size_,
                " (collective timeout ", timeout_.count(),
                " ms; another rank may have died, hung, or issued different collectives",
                progress_->report(work.get()), "): ", e.what());
  }
  progress_->done(work.get());
}

void ProcessGroup::allreduce_sum(at::Tensor& tensor, const std::string& what) {
  wait(allreduce_sum_async(tensor), what);
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root, const std::string& what) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  wait(issued(backend_->broadcast(tensors, opts),
              {"broadcast", tensor.numel(), tensor.scalar_type(), root}),
       what);
}

std::vector<at::Tensor> ProcessGroup::allgather(const at::Tensor& tensor, const std::string& what) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(tensor));
  std::vector<at::Tensor> inputs{tensor};
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  wait(issued(backend_->allgather(outputs, inputs, opts),
              {"all-gather", tensor.numel(), tensor.scalar_type()}),
       what);
  return outputs[0];
}

void ProcessGroup::barrier(const std::string& what) {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  wait(issued(backend_->barrier(opts), {"barrier"}), what);
}

}  // namespace ddp::comm
