#pragma once
// The replicated parameters' contact with the autograd engine: a post-hook on each parameter's
// gradient accumulator (runs after AccumulateGrad wrote param.grad, i.e. when the gradient is final
// for this backward: the engine sums all uses of a parameter before its accumulator runs). The
// end-of-backward callback is autograd/end_of_backward.hpp's, one per backward for every runtime.
//
// Streams: since torch 2.x an AccumulateGrad node keeps the stream that was current when it was
// created, and the engine makes the producer of a gradient wait for that stream. Holding the
// nodes (the keys need them) pins them to the stream of the wrapper's construction, usually the
// default stream, and a CUDA graph captured on another stream then fails ("operation would make
// the legacy stream depend on a capturing blocking stream"). follow_current_stream() therefore
// re-creates the nodes and their hooks when a forward runs on a stream other than the one they
// were made on (PyTorch's recipe instead asks users to build DDP on the capture stream).

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace ddp::gradients {

class AutogradHooks {
 public:
  // Installs one post-hook per parameter; `on_ready(i)` runs on the autograd thread that ran
  // params[i]'s accumulator. `names` only name a parameter without an accumulator in the error.
  AutogradHooks(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
                std::function<void(size_t)> on_ready);
  ~AutogradHooks();  // removes every hook: none runs after this
  AutogradHooks(const AutogradHooks&) = delete;
  AutogradHooks& operator=(const AutogradHooks&) = delete;

  // Between backwards (a forward is starting): if the parameters' device has another current
  // stream than the one the accumulators were made on, drops them and installs the hooks on new
  // ones made now, on the current stream. An accumulator that something else keeps alive (a
  // graph from an earlier step still held, e.g. by its loss) cannot be renewed and keeps its
  // stream. Cheap when the stream did not change (one stream query).
  void follow_current_stream();

 private:
  void install();
  void remove();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::function<void(size_t)> on_ready_;
  c10::Stream stream_;  // current on the parameters' device when the accumulators were made
  // The accumulator nodes are kept alive so the keys stay valid for removal.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace ddp::gradients
