#include "ddp/tp/region_ops.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/autograd/backward_node.hpp"

namespace ddp::tp {
namespace {

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
  return autograd::attach_backward(
      x.detach(), x,
      [group](const at::Tensor& g) {
        return g.defined() ? all_reduced(g, group, "tp copy_to_region backward") : g;
      },
      "ddp::tp::CopyToRegion");
}

at::Tensor reduce_from_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return autograd::attach_backward(
      all_reduced(x, group, "tp reduce_from_region"), x, [](const at::Tensor& g) { return g; },
      "ddp::tp::ReduceFromRegion");
}

at::Tensor scatter_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return autograd::attach_backward(
      my_slice(x.detach(), group), x,
      [group](const at::Tensor& g) { return g.defined() ? gather_along(g, -1, group) : g; },
      "ddp::tp::ScatterLastDim");
}

at::Tensor gather_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return autograd::attach_backward(
      gather_along(x, -1, group), x,
      [group](const at::Tensor& g) { return g.defined() ? my_slice(g, group) : g; },
      "ddp::tp::GatherLastDim");
}

}  // namespace ddp::tp
