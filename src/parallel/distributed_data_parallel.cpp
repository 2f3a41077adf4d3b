#include "ddp/parallel/distributed_data_parallel.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <unordered_set>

#include "ddp/buckets/bucket_table.hpp"
#include "ddp/obs/log.hpp"
#include "ddp/parallel/replica_check.hpp"

namespace ddp::parallel {

namespace {

size_t mib_to_bytes(double mib, const char* field) {
  TORCH_CHECK(mib > 0, "ddp: DDPOptions::", field, " must be positive, got ", mib);
  return static_cast<size_t>(mib * static_cast<double>(buckets::kMiB));
}

// Broadcasts `tensors` from `root`, one flat collective per dtype instead of one per tensor.
void broadcast_coalesced(comm::ProcessGroup& pg, const std::vector<torch::Tensor>& tensors,
                         const std::string& what) {
  if (pg.world_size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<torch::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);
    pg.broadcast(flat, 0, what);
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         comm::ProcessGroupPtr process_group,
                                                         DDPOptions options)
    : module_(std::move(module)), pg_(std::move(process_group)), options_(options) {
  TORCH_CHECK(module_, "ddp: DistributedDataParallel needs a module");
  TORCH_CHECK(pg_, "ddp: DistributedDataParallel needs a process group");
  reducer::ReducerOptions reducer_options;
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.bucket_cap_bytes = mib_to_bytes(options_.bucket_cap_mb, "bucket_cap_mb");
  reducer_options.first_bucket_cap_bytes =
      mib_to_bytes(options_.first_bucket_cap_mb, "first_bucket_cap_mb");

  // Tied weights are registered under several names; C++ named_parameters() does not deduplicate,
  // so the first name wins and the tensor is reduced once.
  std::vector<std::string> all_names;
  std::vector<torch::Tensor> all_params;
  std::vector<torch::Tensor> grad_params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    all_names.push_back(item.key());
    all_params.push_back(item.value());
    if (item.value().requires_grad()) {
      param_names_.push_back(item.key());
      grad_params.push_back(item.value());
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    buffer_names_.push_back(item.key());
    buffers_.push_back(item.value());
  }

  auto signature = replica_signature(all_names, all_params, "parameter");
  auto buffer_signature = replica_signature(buffer_names_, buffers_, "buffer");
  signature.insert(signature.end(), buffer_signature.begin(), buffer_signature.end());
  verify_replicas(*pg_, signature);

  // Every rank starts from rank 0's state, as PyTorch DDP does.
  std::vector<torch::Tensor> state = all_params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*pg_, state, "broadcast of rank 0's parameters and buffers");

  reducer_ = std::make_unique<reducer::Reducer>(grad_params, param_names_, pg_, reducer_options);
  if (pg_->rank() == 0) {
    const auto level = options_.verbose ? obs::LogLevel::kWarn : obs::LogLevel::kInfo;
    obs::log(level, pg_->rank(), bucket_table());
  }
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

std::string DistributedDataParallelBase::bucket_table() const {
  return buckets::format_bucket_table(reducer_->plan(), reducer_->param_specs());
}

void DistributedDataParallelBase::sync_buffers() {
  broadcast_coalesced(*pg_, buffers_, "broadcast of rank 0's buffers");
}

void DistributedDataParallelBase::pre_forward() {
  if (options_.broadcast_buffers && require_sync_ && torch::GradMode::is_enabled()) sync_buffers();
}

void DistributedDataParallelBase::post_forward(const std::vector<torch::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled()) return;  // inference: no backward will follow
  if (require_sync_) {
    TORCH_CHECK(!options_.find_unused_parameters || !outputs.empty(),
                "ddp: find_unused_parameters needs the forward to return tensors (a Tensor, a "
                "vector, pair or tuple of them) to walk the graph from");
    reducer_->prepare_for_backward(outputs);
  } else {
    reducer_->prepare_for_local_backward();
  }
}

}  // namespace ddp::parallel
