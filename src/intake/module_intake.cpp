#include "ddp/intake/module_intake.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <set>
#include <unordered_map>

#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
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

namespace {

// A placeholder of deferred initialisation (shard/deferred_init.hpp): one value expanded to the
// parameter's shape. No module owns such a parameter otherwise.
bool is_placeholder(const at::Tensor& t) {
  if (t.numel() <= 1) return false;
  for (const int64_t stride : t.strides()) {
    if (stride != 0) return false;
  }
  return true;
}

}  // namespace

void synchronize_replicas(comm::ProcessGroup& group, const ModuleIntake& intake,
                          const std::string& who, const AbsentValues& absent) {
  auto signature = replica_signature(intake.names, intake.params, "parameter");
  const auto buffers = replica_signature(intake.buffer_names, intake.buffers, "buffer");
  signature.insert(signature.end(), buffers.begin(), buffers.end());
  {
    const comm::ForPurpose purpose({comm::Purpose::kCheck});
    verify_replicas(group, signature);
  }
  for (size_t i = 0; i < intake.params.size(); ++i) {
    TORCH_CHECK(absent.count(intake.params[i].unsafeGetTensorImpl()) != 0 ||
                    !is_placeholder(intake.params[i]),
                "ddp: ", who, ": parameter '", intake.names[i],
                "' holds no values: deferred initialisation kept only this rank's rows of it, "
                "for another style than this wrapper's; wrap the model with the style it was "
                "built for");
  }
  if (group.world_size() == 1) return;
  const comm::CollectivePurpose what{comm::Purpose::kParamBroadcast};
  const comm::ForPurpose purpose(what);
  // Every rank starts from rank 0's state, as PyTorch's DDP does; a value no rank holds whole is
  // only checked (every rank built it from the same draws: [Note: the same draws as one process]).
  std::vector<at::Tensor> state = intake.params;
  state.insert(state.end(), intake.buffers.begin(), intake.buffers.end());
  std::vector<std::string> names = intake.names;
  names.insert(names.end(), intake.buffer_names.begin(), intake.buffer_names.end());
  std::vector<at::Tensor> whole;
  for (const at::Tensor& t : state) {
    if (absent.count(t.unsafeGetTensorImpl()) == 0) whole.push_back(t);
  }
  comm::broadcast_coalesced(group, whole, 0, who + ": broadcast of " + what.describe());
  if (state.empty()) return;
  // The checksum of every tensor, compared with rank 0's (one small broadcast) and the
  // disagreements counted (one small all-reduce), so that every rank raises the same error. Exact
  // equality is expected: the broadcast copied the bytes. Computed where the tensors live and
  // stacked there: no copy of the model to the host and one device sync (the comparison's)
  // instead of two per tensor.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  sums.reserve(state.size());
  for (const at::Tensor& t : state) {
    const auto it = absent.find(t.unsafeGetTensorImpl());
    sums.push_back(it != absent.end() ? it->second : checksum(t));
  }
  const std::vector<int64_t> counts = ranks_differing_from_rank0(group, sums, who);
  for (size_t i = 0; i < state.size(); ++i) {
    const int64_t ranks = counts[i];
    if (absent.count(state[i].unsafeGetTensorImpl()) != 0) {
      TORCH_CHECK(ranks == 0, "ddp: ", who, ": parameter '", names[i],
                  "' was initialised with other values on ", ranks,
                  " rank(s) than on rank 0 (deferred initialisation keeps each rank's rows, so "
                  "no broadcast can repair it): seed every rank alike before building the model");
      continue;
    }
    TORCH_CHECK(ranks == 0, "ddp: ", who, ": after the broadcast of rank 0's state, ",
                i < intake.params.size() ? "parameter '" : "buffer '", names[i],
                "' still differs from rank 0's on ", ranks,
                " rank(s); it must be a tensor the module owns (not a view of another "
                "tensor or a copy the module replaces in forward)");
  }
}

}  // namespace ddp::intake
