#include "ddp/io/full_state_dict.hpp"

#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/layout_tensors.hpp"
#include "ddp/io/sharded_checkpoint.hpp"
#include "ddp/io/torch_save.hpp"
#include "every_rank.hpp"

namespace ddp::io {

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

TensorMap gather_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                            const torch::nn::Module& model) {
  TORCH_CHECK(
      sharded.plan().world == group.world_size(),
      wrong_group_for_layouts("gather_full_state", sharded.plan().world, group.world_size()));
  sharded.require_between_steps("gather_full_state");
  return whole_state(model, sharded.layouts(), &group);
}

void export_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                       const torch::nn::Module& model, const std::string& path) {
  const TensorMap state = gather_full_state(group, sharded, model);
  detail::on_every_rank(group, "full state export check", "export to " + path + " failed", [&] {
    if (group.rank() == 0) save_weights(path, state);
  });
}

}  // namespace ddp::io
