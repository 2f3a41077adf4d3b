#pragma once
// ResNet-18 for 32x32 images (CIFAR-sized): torchvision's resnet18 with a 3x3 stride-1 stem and no
// max-pool, so the 32x32 input reaches layer4 as 4x4 rather than 1x1. Parameter names are
// torchvision's (conv1.weight, bn1.weight, layer1.0.conv1.weight, ...,
// layer2.0.downsample.0.weight, ..., fc.weight, fc.bias), so checkpoints and
// bench/reference/torch_ddp.py line up by name. The BatchNorm layers carry buffers (running_mean,
// running_var, num_batches_tracked), the one zoo model at benchmark scale that exercises buffer
// broadcast. They are ddp::nn::SyncBatchNorm2d: synchronised across the wrapper's group when
// built with sync_batch_norm (--sync-bn, PyTorch's convert_sync_batchnorm), per-rank BatchNorms
// (bit for bit torch's) otherwise.

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "ddp/nn/sync_batch_norm.hpp"

namespace ddp::models {

// torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), both convs 3x3.
// Parameters in order: conv1.weight, bn1.{weight,bias}, conv2.weight, bn2.{weight,bias}, then,
// when the block changes resolution or width, downsample.0.weight (1x1 conv) and
// downsample.1.{weight,bias} (its BatchNorm).
class BasicBlockImpl : public torch::nn::Module {
 public:
  // stride 2 halves the resolution in conv1 and in the 1x1 downsample.
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr};
  ddp::nn::SyncBatchNorm2d bn1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  ddp::nn::SyncBatchNorm2d bn2{nullptr};
  // Null (and not registered) when the shortcut is the identity, as in torchvision.
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// conv1 (3 -> width, 3x3, stride 1, pad 1, no bias), bn1, relu; layer1..layer4 of two BasicBlocks
// each with width, 2w, 4w, 8w channels (stride 2 at the first block of layers 2-4); adaptive
// average pool to 1x1, flatten, fc Linear(8w, num_classes). 11.2 M parameters at the default
// width 64. Convolutions are initialized as torchvision does (Kaiming normal, fan_out, ReLU),
// BatchNorms to weight 1 / bias 0, fc by Linear's default; construction after torch::manual_seed(s)
// is deterministic.
class ResNetSmallImpl : public torch::nn::Module {
 public:
  // 10 classes: CIFAR-10's count. width 64: ResNet-18's; smaller widths keep CPU tests quick.
  // sync_batch_norm false (default): every BatchNorm keeps per-rank statistics (keep_local), as
  // PyTorch's model before convert_sync_batchnorm.
  explicit ResNetSmallImpl(int64_t num_classes = 10, int64_t width = 64,
                           bool sync_batch_norm = false);

  // x: float [B, 3, H, W] (32x32 intended; any size >= 8 works) -> logits [B, num_classes].
  // Training mode needs B >= 2 (BatchNorm batch statistics), like any BatchNorm network.
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr};
  ddp::nn::SyncBatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr};
  torch::nn::Sequential layer2{nullptr};
  torch::nn::Sequential layer3{nullptr};
  torch::nn::Sequential layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNetSmall);

}  // namespace ddp::models
