#include "ddp/io/full_state_dict.hpp"

#include <map>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/io/torch_save.hpp"
#include "every_rank.hpp"

namespace ddp::io {

TensorMap gather_full_state(comm::ProcessGroup& group, const shard::ShardPlan& plan,
                            const torch::nn::Module& model) {
  TORCH_CHECK(plan.world == group.world_size(), "ddp: gather_full_state: the shard plan is for ",
              plan.world, " ranks but the group has ", group.world_size());
  std::map<std::string, at::Tensor> by_name;
  for (const auto& item : model.named_parameters()) by_name[item.key()] = item.value();
  std::unordered_map<const c10::TensorImpl*, at::Tensor> full;
  // Plan order, which is the same on every rank: the all-gathers match.
  for (size_t i = 0; i < plan.shapes.size(); ++i) {
    const shard::ParamShape& shape = plan.shapes[i];
    const shard::ParamShard& place = plan.params[i];
    const auto it = by_name.find(shape.name);
    TORCH_CHECK(it != by_name.end(), "ddp: gather_full_state: the shard plan's parameter '",
                shape.name, "' is not a parameter of the model");
    const c10::TensorImpl* identity = it->second.unsafeGetTensorImpl();  // detach() makes another
    const at::Tensor local = it->second.detach();
    if (place.placement == shard::Placement::kReplicate) {
      full[identity] = local.cpu().clone();
      continue;
    }
    TORCH_CHECK(local.dim() > 0 && local.size(0) == place.chunk,
                "ddp: gather_full_state: "
                "parameter '",
                shape.name, "' has shape ", local.sizes(), ", not its shard of ", place.chunk,
                " rows: call it between steps");
    // Every rank contributes its padded [chunk, ...] shard, so the gather takes the even path
    // (world * chunk rows); the padding rows at the end of each shard are cut out afterwards.
    const int64_t numel = local.numel() * group.world_size();
    at::Tensor gathered =
        group.all_gather(local.contiguous().reshape({-1}), numel, "full state gather");
    std::vector<int64_t> padded = shape.shape;
    padded[0] = place.chunk * group.world_size();
    full[identity] = gathered.view(padded).narrow(0, 0, place.rows).cpu().contiguous();
  }
  TensorMap out;
  for (const auto& item : model.named_parameters())
    out[item.key()] = full.at(item.value().unsafeGetTensorImpl());
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value().detach().cpu();
  return out;
}

void export_full_state(comm::ProcessGroup& group, const shard::ShardPlan& plan,
                       const torch::nn::Module& model, const std::string& path) {
  const TensorMap state = gather_full_state(group, plan, model);
  detail::on_every_rank(group, "full state export check", "export to " + path + " failed", [&] {
    if (group.rank() == 0) save_weights(path, state);
  });
}

}  // namespace ddp::io
