#include "ddp/tp/region_ops.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <functional>
#include <utility>

namespace ddp::tp {
namespace {

using Backward = std::function<at::Tensor(const at::Tensor&)>;

// One gradient in, one out: `backward` maps the gradient of the op's output to its input's.
struct RegionNode : torch::autograd::Node {
  RegionNode(Backward backward, const char* name) : backward_(std::move(backward)), name_(name) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {backward_(grads[0])};
  }
  std::string name() const override { return name_; }

 private:
  Backward backward_;
  const char* name_;
};

// `value` (computed from `x` without autograd) as the op's output, with `backward` as its node.
at::Tensor attach(at::Tensor value, const at::Tensor& x, Backward backward, const char* name) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return value;
  auto node = std::shared_ptr<RegionNode>(new RegionNode(std::move(backward), name),
                                          torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(value, node);
  return value;
}

at::Tensor all_reduced(const at::Tensor& x, const comm::ProcessGroupPtr& group, const char* what) {
  at::Tensor sum = x.detach().contiguous().clone();
  if (group->world_size() > 1) group->allreduce_sum(sum, what);
  return sum;
}

at::Tensor my_slice(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  const int64_t n = group->world_size(), last = x.size(-1);
  TORCH_CHECK(last % n == 0, "ddp: tensor-parallel split of a last dim of ", last, " over ", n,
              " ranks: it does not divide");
  return x.narrow(-1, group->rank() * (last / n), last / n).contiguous();
}

}  // namespace

at::Tensor gather_along(const at::Tensor& piece, int64_t dim, const comm::ProcessGroupPtr& group) {
  const int64_t n = group->world_size();
  if (n == 1) return piece.detach().clone();
  const at::Tensor flat = piece.detach().contiguous().reshape({-1});
  const at::Tensor all = group->all_gather(flat, flat.numel() * n, "tensor-parallel all-gather");
  std::vector<int64_t> by_rank{n};
  for (int64_t s : piece.sizes()) by_rank.push_back(s);
  const at::Tensor stacked = all.view(by_rank);  // [n, piece...]
  const int64_t d = dim < 0 ? dim + piece.dim() : dim;
  return at::cat(stacked.unbind(0), d);
}

at::Tensor copy_to_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return attach(
      x.detach(), x,
      [group](const at::Tensor& g) { return all_reduced(g, group, "tp copy_to_region backward"); },
      "ddp::tp::CopyToRegion");
}

at::Tensor reduce_from_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return attach(
      all_reduced(x, group, "tp reduce_from_region"), x, [](const at::Tensor& g) { return g; },
      "ddp::tp::ReduceFromRegion");
}

at::Tensor scatter_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return attach(
      my_slice(x.detach(), group), x,
      [group](const at::Tensor& g) { return gather_along(g, -1, group); },
      "ddp::tp::ScatterLastDim");
}

at::Tensor gather_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return attach(
      gather_along(x, -1, group), x, [group](const at::Tensor& g) { return my_slice(g, group); },
      "ddp::tp::GatherLastDim");
}

}  // namespace ddp::tp
