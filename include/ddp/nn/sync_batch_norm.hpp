#pragma once
// SyncBatchNorm: batch normalisation over the global batch, every rank's samples together, as
// torch.nn.SyncBatchNorm. A drop-in for torch::nn::BatchNorm{1,2,3}d: the same options
// (torch::nn::BatchNormOptions) and the same parameter and buffer names (weight, bias,
// running_mean, running_var, num_batches_tracked), so a checkpoint of either loads into the other.
//
//   struct Block : torch::nn::Module {
//     torch::nn::Conv2d conv{...};
//     ddp::nn::SyncBatchNorm2d bn{torch::nn::BatchNormOptions(64)};  // was torch::nn::BatchNorm2d
//   };
//   auto model = ddp::data_parallel(block, group, style);  // binds bn to the wrapper's group
//
// Why a type and not PyTorch's convert_sync_batchnorm(module): a C++ module calls its typed
// members directly (`bn->forward(x)`), so a child swapped in the module's registry after
// construction would never run. The wrappers bind every unbound SyncBatchNorm of the module they
// take in to their group; bind_sync_batch_norms does it by hand (another group, a model that is
// not wrapped). Unbound, or bound to a group of one rank, it is a plain BatchNorm.
//
// Training (the group's ranks' batches together):
//   forward   each rank's per-channel count, mean and sum of squared deviations, gathered in one
//             collective and combined (Chan's parallel rule: an uneven or empty local batch weighs
//             by its count); the running statistics updated with the global mean and unbiased
//             variance, as one process would on the global batch
//   backward  the per-channel sums of dy and dy * (x - mean) all-reduced in one collective; the
//             input's gradient from the global sums, the weight's and bias's from this rank's
//             samples (the wrapper averages them as any gradient)
// Each rank's loss must weigh its samples as the global batch does (the loss of a rank with k of
// the global B samples summed over them, times world / B), as for any data-parallel gradient.
// Evaluation: the running statistics, no communication.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <cstddef>

#include "ddp/comm/process_group.hpp"

namespace ddp::nn {

// The group a SyncBatchNorm combines its batches over; every SyncBatchNorm is one.
class SyncBatchNormGroup {
 public:
  virtual ~SyncBatchNormGroup() = default;
  // Null: unbound (a plain BatchNorm until a wrapper or bind_sync_batch_norms binds it).
  const comm::ProcessGroupPtr& group() const { return group_; }
  void bind(comm::ProcessGroupPtr group) {
    group_ = std::move(group);
    local_ = false;
  }
  // Per-rank statistics by choice: unbound, and left so by the wrappers (bind_sync_batch_norms
  // with only_unbound). One model type built both ways: the zoo's resnet-small without --sync-bn,
  // PyTorch's BatchNorm unless converted.
  void keep_local() {
    group_.reset();
    local_ = true;
  }
  bool local() const { return local_; }

 private:
  comm::ProcessGroupPtr group_;
  bool local_ = false;  // keep_local() was called and no bind() since
};

// The tensors and flags of one BatchNorm call: what sync_batch_norm reads and updates.
struct BatchNormState {
  at::Tensor weight, bias;                                    // undefined without affine
  at::Tensor running_mean, running_var, num_batches_tracked;  // undefined without running stats
  const torch::nn::BatchNormOptions* options = nullptr;
  bool training = true;
};

// The forward of every SyncBatchNorm: the global batch's statistics over `group` when training
// with more than one rank, else torch's batch_norm (a plain BatchNorm). Collective when it
// communicates: every rank of the group calls it, an empty local batch included.
at::Tensor sync_batch_norm(const at::Tensor& input, const BatchNormState& state,
                           const comm::ProcessGroupPtr& group);

template <size_t D, typename Derived>
class SyncBatchNormImplBase
    : public torch::nn::NormImplBase<D, Derived, torch::nn::BatchNormOptions>,
      public SyncBatchNormGroup {
 public:
  using torch::nn::NormImplBase<D, Derived, torch::nn::BatchNormOptions>::NormImplBase;

  at::Tensor forward(const at::Tensor& input) {
    this->_check_input_dim(input);
    return sync_batch_norm(input,
                           {this->weight, this->bias, this->running_mean, this->running_var,
                            this->num_batches_tracked, &this->options, this->is_training()},
                           group());
  }

 protected:
  // (N, C) or (N, C, L) for 1d, (N, C, H, W) for 2d, (N, C, D, H, W) for 3d, as torch's.
  void _check_input_dim(const at::Tensor& input) override {
    const int64_t dim = input.dim();
    const bool ok = D == 1 ? (dim == 2 || dim == 3) : dim == static_cast<int64_t>(D) + 2;
    TORCH_CHECK(ok, "ddp::nn::SyncBatchNorm", D, "d: expected ",
                D == 1 ? "2D or 3D" : (D == 2 ? "4D" : "5D"), " input (got ", dim, "D input)");
  }
};

class SyncBatchNorm1dImpl : public SyncBatchNormImplBase<1, SyncBatchNorm1dImpl> {
 public:
  using SyncBatchNormImplBase<1, SyncBatchNorm1dImpl>::SyncBatchNormImplBase;
};
class SyncBatchNorm2dImpl : public SyncBatchNormImplBase<2, SyncBatchNorm2dImpl> {
 public:
  using SyncBatchNormImplBase<2, SyncBatchNorm2dImpl>::SyncBatchNormImplBase;
};
class SyncBatchNorm3dImpl : public SyncBatchNormImplBase<3, SyncBatchNorm3dImpl> {
 public:
  using SyncBatchNormImplBase<3, SyncBatchNorm3dImpl>::SyncBatchNormImplBase;
};
TORCH_MODULE(SyncBatchNorm1d);
TORCH_MODULE(SyncBatchNorm2d);
TORCH_MODULE(SyncBatchNorm3d);

// Binds every SyncBatchNorm in `module`'s tree (itself included) to `group`; `only_unbound`:
// those neither bound yet nor kept local (what the wrappers do, so a hand-bound sub-group and a
// keep_local() stay). Returns how many
// were bound.
int bind_sync_batch_norms(torch::nn::Module& module, const comm::ProcessGroupPtr& group,
                          bool only_unbound = false);

}  // namespace ddp::nn
