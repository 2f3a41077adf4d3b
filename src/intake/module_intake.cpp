#include "ddp/intake/module_intake.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <set>
#include <unordered_map>

#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/intake/replica_check.hpp"

namespace ddp::intake {

std::vector<size_t> ModuleIntake::trainable() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].requires_grad()) out.push_back(i);
  }
  return out;
}

std::vector<at::Tensor> ModuleIntake::trainable_params() const {
  std::vector<at::Tensor> out;
  for (size_t i : trainable()) out.push_back(params[i]);
  return out;
}

std::vector<std::string> ModuleIntake::trainable_names() const {
  std::vector<std::string> out;
  for (size_t i : trainable()) out.push_back(names[i]);
  return out;
}

ModuleIntake take_in(const torch::nn::Module& module, const std::vector<std::string>& ignore) {
  const std::set<std::string> ignored(ignore.begin(), ignore.end());
  std::set<std::string> known;
  ModuleIntake in;
  std::unordered_map<const c10::TensorImpl*, size_t> index;  // parameter -> its index in `in`
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    known.insert(item.key());
    if (ignored.count(item.key()) != 0) continue;
    const auto [it, fresh] = index.emplace(item.value().unsafeGetTensorImpl(), in.params.size());
    if (!fresh) {
      in.aliases[it->second].push_back(item.key());
      continue;
    }
    in.params.push_back(item.value());
    in.names.push_back(item.key());
    in.aliases.emplace_back();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    known.insert(item.key());
    if (ignored.count(item.key()) != 0) continue;
    if (!index.emplace(item.value().unsafeGetTensorImpl(), SIZE_MAX).second) continue;
    in.buffers.push_back(item.value());
    in.buffer_names.push_back(item.key());
  }
  for (const auto& name : ignored) {
    TORCH_CHECK(known.count(name), "ddp: params_to_ignore names '", name,
                "', which is not a parameter or buffer of the module");
  }
  return in;
}

void synchronize_replicas(comm::ProcessGroup& group, const ModuleIntake& intake,
                          const std::string& who) {
  auto signature = replica_signature(intake.names, intake.params, "parameter");
  const auto buffers = replica_signature(intake.buffer_names, intake.buffers, "buffer");
  signature.insert(signature.end(), buffers.begin(), buffers.end());
  {
    const comm::ForPurpose purpose({comm::Purpose::kCheck});
    verify_replicas(group, signature);
  }
  if (group.world_size() == 1) return;
  const comm::ForPurpose purpose({comm::Purpose::kParamBroadcast});
  // Every rank starts from rank 0's state, as PyTorch's DDP does.
  std::vector<at::Tensor> state = intake.params;
  state.insert(state.end(), intake.buffers.begin(), intake.buffers.end());
  std::vector<std::string> names = intake.names;
  names.insert(names.end(), intake.buffer_names.begin(), intake.buffer_names.end());
  comm::broadcast_coalesced(group, state, 0,
                            who + ": broadcast of rank 0's parameters and buffers");
  if (state.empty()) return;
  // The checksum: per tensor, the sum and the sum of squares of its values in float64 (NaNs as
  // 0), compared with rank 0's (one small broadcast) and the disagreements counted (one small
  // all-reduce), so that every rank raises the same error. Exact equality is expected: the
  // broadcast copied the bytes.
  at::NoGradGuard no_grad;
  // Computed where the tensors live and stacked there: no copy of the model to the host and one
  // device sync (the comparison's) instead of two per tensor.
  const at::Device device = state[0].device();
  std::vector<at::Tensor> sums;
  sums.reserve(state.size());
  for (const at::Tensor& t : state) {
    const at::Tensor values = at::nan_to_num(t.detach().to(at::kDouble));
    sums.push_back(at::stack({values.sum(), values.square().sum()}).to(device));
  }
  const at::Tensor device_mine = at::stack(sums);
  at::Tensor reference = device_mine.clone();
  group.broadcast(reference, 0, who + ": checksum of rank 0's parameters and buffers");
  at::Tensor differs = device_mine.ne(reference).any(1).to(at::kDouble);
  group.allreduce_sum(differs, who + ": comparison of the parameter and buffer checksums");
  const at::Tensor counts = differs.to(at::kCPU);
  for (size_t i = 0; i < state.size(); ++i) {
    const auto ranks = static_cast<int64_t>(counts[static_cast<int64_t>(i)].item<double>());
    TORCH_CHECK(ranks == 0, "ddp: ", who, ": after the broadcast of rank 0's state, ",
                i < intake.params.size() ? "parameter '" : "buffer '", names[i],
                "' still differs from rank 0's on ", ranks,
                " rank(s); it must be a tensor the module owns (not a view of another "
                "tensor or a copy the module replaces in forward)");
  }
}

}  // namespace ddp::intake
