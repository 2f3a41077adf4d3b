#include "ddp/comm/fake_backend.hpp"

#include "ddp/comm/done_work.hpp"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace ddp::comm {
namespace {

c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> tensors = {}) {
  return done_work(std::move(tensors));
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
    return {c10::make_intrusive<FakeBackend>(rank, size), {}, {}};
  };
}

}  // namespace ddp::comm
