#include "ddp/io/full_state_dict.hpp"

#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/sharding/layout_tensors.hpp"

namespace ddp::io {

TensorMap whole_state(const torch::nn::Module& model, const comm::Sharding& sharding) {
  comm::check_sharding(sharding, "whole_state");
  TORCH_CHECK(sharding.mesh_group || sharding.layouts.mesh.size() < 2,
              "ddp: whole_state: the sharding is over the ", sharding.layouts.mesh.size(),
              "-D mesh ", at::IntArrayRef(sharding.layouts.mesh),
              " without that mesh's group; take it with the mesh's parent group, e.g. "
              "model.sharding(*tp, mesh.parent())");
  return whole_state(model, sharding.layouts, sharding.mesh_group.get());
}

TensorMap whole_state(const torch::nn::Module& model, const layout::TensorLayouts& layouts,
                      comm::ProcessGroup* group) {
  int64_t ranks = 1;
  for (int64_t n : layouts.mesh) ranks *= n;
  TORCH_CHECK(group != nullptr || ranks == 1, "ddp: whole_state: layouts over mesh ",
              at::IntArrayRef(layouts.mesh), " need the group of its ", ranks, " ranks");
  TORCH_CHECK(group == nullptr || group->world_size() == ranks,
              "ddp: whole_state: layouts over "
              "mesh ",
              at::IntArrayRef(layouts.mesh), " (", ranks, " ranks) with a group of ",
              group ? group->world_size() : 0, " ranks; pass the group the layouts are over");
  // named_parameters() lists a tied parameter under every name: gathered once, by identity, in
  // the same order on every rank (the collectives must match).
  std::unordered_map<const c10::TensorImpl*, at::Tensor> whole;
  TensorMap out;
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& param = item.value();
    auto it = whole.find(param.unsafeGetTensorImpl());
    if (it == whole.end()) {
      const layout::Layout layout = layouts.of(item.key(), param.sizes().vec());
      const at::Tensor local = comm::real_local(layout, param, layouts.coordinate,
                                                "whole_state: parameter '" + item.key() + "'");
      at::Tensor gathered =
          group ? comm::gather_whole(layout, local, *group, "whole state of '" + item.key() + "'")
                : local.clone();
      it = whole.emplace(param.unsafeGetTensorImpl(), gathered.cpu()).first;
    }
    out[item.key()] = it->second;
  }
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value().detach().cpu();
  return out;
}

}  // namespace ddp::io
