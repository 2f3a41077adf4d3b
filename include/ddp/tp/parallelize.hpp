#pragma once
// Tensor parallelism for torch::nn::Linear, Megatron's pairing, applied by a plan keyed by
// qualified submodule name (torchtitan's way: the model's code stays as written):
//
//   auto tp = ddp::tp::parallelize_module(net.ptr(), mesh["tp"],
//                                         {{"fc1", ColwiseParallel()}, {"fc2",
//                                         RowwiseParallel()}});
//
//   colwise  weight [out, in] -> rows [r * out/n, (r+1) * out/n) and the same slice of the bias:
//            the input is replicated (copy_to_region: its gradient is all-reduced in backward),
//            the output stays sharded on its last dim
//   rowwise  weight [out, in] -> columns [r * in/n, (r+1) * in/n), bias replicated: the input is
//            sharded on its last dim (a replicated input is split first), the partial products are
//            all-reduced (reduce_from_region), then the bias is added once
//   rowwise on an Embedding [vocab, dim] -> rows [r * vocab/n, (r+1) * vocab/n) (the vocabulary
//            split, as PyTorch's RowwiseParallel on nn.Embedding): ids held elsewhere give zeros,
//            and the all-reduce of the lookups gives every id its row
//
// So colwise followed by rowwise costs one all-reduce forward and one backward, and every
// gradient is exact locally: a sharded weight's gradient is its shard of the full gradient, and a
// replicated parameter (rowwise bias, or any parameter outside the plan) gets the same gradient
// on every tp rank. Data parallelism over another mesh dim then averages them as usual.
//
// The C++ frontend has no forward hooks: a planned module must run through unit::run_unit (the
// zoo's models do; see unit/unit_scope.hpp). Parameters keep their identity (set_ to the local
// shard), so an optimizer or a data-parallel wrapper built afterwards sees the shards.
//
// [Note: a planned module called directly] Called as `fc1->forward(x)`, a planned module computes
// on its shard without the region collectives: a colwise Linear's input gradient is one rank's
// partial sum, a rowwise Linear's output is. That is a silently wrong gradient, so it is an
// error instead: a tensor hook on each planned parameter throws (out of backward(), before the
// optimizer can step) when the gradient arrives and the module has run no run_unit forward under
// grad mode since the last backward ended. Each backward's end uses up one such forward (two
// forwards, then two backwards, stay legal). The hooks are installed once: tensor hooks stay
// through the set_() with which a sharded wrapper over the module moves its parameters.

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/ordered_dict.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/layout/layout.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::tp {

enum class TpStyle { kColwise, kRowwise };
const char* tp_style_name(TpStyle style);  // "ColwiseParallel", "RowwiseParallel"

// How one Linear is split.
struct ParallelStyle {
  TpStyle style = TpStyle::kColwise;
  // Colwise only: the output is `packed` equal chunks side by side (a fused q, k, v projection:
  // 3), and each chunk is split on its own, so that every rank gets the same heads of each. 1
  // (default): one chunk.
  int64_t packed = 1;
  ParallelStyle(TpStyle s = TpStyle::kColwise, int64_t p = 1) : style(s), packed(p) {}  // NOLINT
};
inline ParallelStyle ColwiseParallel(int64_t packed = 1) { return {TpStyle::kColwise, packed}; }
inline ParallelStyle RowwiseParallel() { return {TpStyle::kRowwise, 1}; }

// Qualified submodule name -> style, applied in this order.
using TpPlan = std::vector<std::pair<std::string, ParallelStyle>>;

class TensorParallel : private unit::UnitListener {
 public:
  // The kind it registers its planned modules under (unit::is_unit_of): the one spelling.
  static constexpr const char* kKind = "tensor-parallel";
  // Collective over `group`: rank 0's full weights are broadcast, then every rank keeps its
  // shard. Errors name the plan entry: a missing submodule, one that is not a Linear, a sharded
  // dim the group size does not divide.
  TensorParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
                 const TpPlan& plan);
  ~TensorParallel() override;
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  const comm::ProcessGroupPtr& group() const { return group_; }
  // How parameter `name` is split over the tp group: the tensor dim, or -1 when replicated.
  int64_t shard_dim(const std::string& name) const;
  // Parameter `name` (any of a tied parameter's names) as a layout over the tp group (mesh
  // {tp size}): its whole shape, and Shard(dim, packed) or no placement when replicated. A
  // runtime that splits the local shards again nests its layout on this one (layout::nest).
  // Throws naming `name` when the module has no such parameter.
  layout::Layout layout(const std::string& name) const;
  // Every parameter's layout (as layout(name)) and this rank's coordinate {tp rank}: what the
  // checkpoints and the export read (layout/tensor_layouts.hpp).
  const layout::TensorLayouts& layouts() const { return layouts_; }
  // The same with its group (comm/sharding/sharding.hpp): mesh {tp}, over group().
  comm::Sharding sharding() const { return {layouts_, {group_}, group_}; }
  // `local` (parameter `name`'s local shard, or a tensor shaped like it, e.g. its gradient) made
  // whole; a replicated parameter's tensor comes back as a copy. Collective over the tp group.
  at::Tensor full(const std::string& name, const at::Tensor& local) const;
  // This rank's part of `whole` (parameter `name` made whole, e.g. by full() on another mesh):
  // the slice the plan gives this rank, a copy; a replicated parameter's tensor comes back as a
  // copy. No communication. Throws naming the parameter when `whole` has the wrong shape for the
  // tp size. Loading a whole checkpoint onto any tp size goes through it.
  at::Tensor local(const std::string& name, const at::Tensor& whole) const;
  // The split parameters as a markdown table: name, style, whole shape, this rank's shape (what
  // ddp-train / ddp-bench --tp --verbose print next to the bucket or unit table, whose sizes are
  // the local ones). No communication.
  std::string table() const;

 private:
  struct Planned {
    std::string name;
    ParallelStyle style;
    torch::nn::LinearImpl* linear = nullptr;        // a Linear entry, or
    torch::nn::EmbeddingImpl* embedding = nullptr;  // a vocabulary-parallel Embedding entry
    at::Tensor bias;        // rowwise Linear: the registered bias, added after the all-reduce
    int64_t first_row = 0;  // Embedding: the first vocabulary row this rank holds
    at::Tensor outside;     // Embedding: this forward's ids held by other ranks (until after)
    std::vector<at::Tensor> params;  // the parameters the entry splits or wraps
    std::vector<std::string> param_names;
    // [Note: a planned module called directly]: run_unit forwards under grad mode not yet used up
    // by the end of a backward (incremented in before_unit_forward, decremented at a backward's
    // end, never below 0); a gradient arriving while it is 0 is the error.
    int forwards = 0;
    std::vector<std::pair<at::Tensor, unsigned>> hook_ids;  // tensor hooks on `params`
  };
  void watch_gradients(size_t unit);
  void on_gradient(size_t unit);
  torch::nn::Module& check_entry(
      const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules,
      const std::string& name, const ParallelStyle& spec) const;
  void apply_entry(const std::string& name, const ParallelStyle& spec, torch::nn::Module& target);
  // `param` (registered as `name`) becomes this rank's part under Shard(dim, packed) over the tp
  // group (comm::take_local: the layouts' even split), and its layout and style are recorded.
  void split(const std::string& name, at::Tensor& param, int64_t dim, int64_t packed,
             const std::string& style);
  const char* kind() const override { return kKind; }
  at::Tensor before_unit_forward(size_t unit, const at::Tensor& input) override;
  at::Tensor after_unit_forward(size_t unit, const at::Tensor& output) override;

  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroupPtr group_;
  std::vector<Planned> planned_;
  // Every parameter's layout over the tp group, the one description full(), local(), shard_dim()
  // and the checkpoints read; made at construction (a split one as it is split, the rest from
  // their shapes then), a tied parameter under each of its names.
  layout::TensorLayouts layouts_;
  // The split parameters' plan styles, for table(); a tied parameter under each of its names.
  std::map<std::string, std::string> styles_;
  std::vector<std::unique_ptr<unit::UnitRegistration>> registrations_;
  bool end_queued_ = false;  // this backward's end-of-backward callback is queued
};

// TensorParallel over `module`; keep it alive as long as the module trains.
std::unique_ptr<TensorParallel> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                   comm::ProcessGroupPtr group, const TpPlan& plan);

}  // namespace ddp::tp
