#include "ddp/comm/fake_backend.hpp"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>

#include <string>
#include <vector>

namespace ddp::comm {
namespace {

// A collective that is over before it is returned. Its future holds the tensors it was given, as
// Gloo's and NCCL's do (the comm hooks read the first); on the tensors' devices, which a future
// of CUDA tensors must name.
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) { finish(); }
  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::vector<c10::Device> devices;
    for (const auto& t : tensors_) {
      if (!t.device().is_cpu() &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    auto future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
    future->markCompleted(c10::IValue(tensors_));
    return future;
  }

 private:
  std::vector<at::Tensor> tensors_;
};

c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> tensors = {}) {
  return c10::make_intrusive<DoneWork>(std::move(tensors));
}

class FakeBackend : public detail::CollectiveBackend {
 public:
  FakeBackend(int rank, int size) : detail::CollectiveBackend(rank, size) {}

  const std::string getBackendName() const override { return "fake"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& /*opts*/) override {
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& /*opts*/) override {
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& /*opts*/) override {
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    for (size_t i = 0; i < outputs.size() && i < inputs.size(); ++i) {
      for (auto& out : outputs[i]) out.copy_(inputs[i]);
    }
    return done(outputs.empty() ? std::vector<at::Tensor>{} : outputs[0]);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& /*input*/,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    return done({output});
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& /*input*/,
      const c10d::ReduceScatterOptions& /*opts*/) override {
    return done({output});
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    return done();
  }
};

}  // namespace

BackendFactory fake_backend_factory() {
  return [](const c10::intrusive_ptr<c10d::Store>& /*store*/, int rank, int size) -> MadeBackend {
    return {c10::make_intrusive<FakeBackend>(rank, size), {}};
  };
}

}  // namespace ddp::comm
