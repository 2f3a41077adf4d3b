#include "ddp/comm/broadcast_coalesced.hpp"

#include <ATen/ATen.h>

#include <map>
#include <utility>

namespace ddp::comm {

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root,
                         const std::string& what) {
  if (pg.world_size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    pg.broadcast(flat, root, what);
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace ddp::comm
