#include "ddp/comm/done_work.hpp"

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <utility>

namespace ddp::comm {
namespace {

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) { finish(); }
  std::vector<at::Tensor> result() override { return tensors_; }
  // On the tensors' devices: a future of CUDA tensors must name them.
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

}  // namespace

c10::intrusive_ptr<c10d::Work> done_work(std::vector<at::Tensor> tensors) {
  return c10::make_intrusive<DoneWork>(std::move(tensors));
}

}  // namespace ddp::comm
