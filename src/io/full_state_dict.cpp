#include "ddp/io/full_state_dict.hpp"

#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/io/sharded_checkpoint.hpp"
#include "ddp/io/torch_save.hpp"
#include "every_rank.hpp"

namespace ddp::io {

TensorMap gather_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                            const torch::nn::Module& model) {
  TORCH_CHECK(sharded.plan().world == group.world_size(),
              wrong_group_for_plan("gather_full_state", sharded.plan().world, group.world_size()));
  // full_parameters() names each parameter once (its first name); named_parameters() lists a
  // tied one under every name: match them by identity.
  std::unordered_map<std::string, at::Tensor> by_first_name;
  for (auto& [name, tensor] : sharded.full_parameters()) by_first_name[name] = tensor.cpu();
  std::unordered_map<const c10::TensorImpl*, at::Tensor> full;
  for (const auto& item : model.named_parameters()) {
    const auto it = by_first_name.find(item.key());
    if (it != by_first_name.end()) full[item.value().unsafeGetTensorImpl()] = it->second;
  }
  TensorMap out;
  for (const auto& item : model.named_parameters()) {
    const auto it = full.find(item.value().unsafeGetTensorImpl());
    TORCH_CHECK(it != full.end(), "ddp: gather_full_state: parameter '", item.key(),
                "' is not one of the sharded module's");
    out[item.key()] = it->second;
  }
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value().detach().cpu();
  return out;
}

void export_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                       const torch::nn::Module& model, const std::string& path) {
  const TensorMap state = gather_full_state(group, sharded, model);
  detail::on_every_rank(group, "full state export check", "export to " + path + " failed", [&] {
    if (group.rank() == 0) save_weights(path, state);
  });
}

}  // namespace ddp::io
