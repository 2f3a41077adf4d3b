#pragma once
// A plain ReLU MLP: many equal-sized layers, the shape that exercises bucket boundaries and
// per-layer communication overlap.

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace ddp::models {

struct MLPOptions {
  // 512: wide enough that a layer is ~1 MiB of fp32 weights, the first-bucket cap.
  int64_t in = 512;
  // 512: equal to in/out so that every middle layer has the same size.
  int64_t hidden = 512;
  // 512: see in.
  int64_t out = 512;
  // 16: deep enough for many buckets and for overlap of communication with backward.
  int64_t depth = 16;
};

// `depth` Linear layers held in the Sequential "layers" (names layers.0.weight, layers.0.bias, ...,
// layers.<depth-1>.bias): in->hidden, hidden->hidden..., hidden->out; ReLU between layers, none
// after the last. The ReLUs are applied in forward rather than stored in the Sequential so that
// layer i is layers.i, not layers.2i.
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const MLPOptions& options = {});

  torch::Tensor forward(torch::Tensor x);

  MLPOptions options;
  torch::nn::Sequential layers{nullptr};
  // false (default): activations kept. true: every layer's are recomputed in backward.
  bool checkpoint_units = false;

 private:
  // Typed handles to the entries of `layers`, so forward need not cast on every call.
  std::vector<torch::nn::Linear> linears_;
};
TORCH_MODULE(MLP);

}  // namespace ddp::models
