#include "support/oracle.hpp"

#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {

std::unique_ptr<torch::optim::Optimizer> make_test_optimizer(const std::string& kind,
                                                             std::vector<torch::Tensor> params,
                                                             double lr) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr / 10));
  }
  if (kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(lr / 10).weight_decay(0.1));
  }
  if (kind == "plain-sgd") {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
  }
  require(kind == "sgd", "make_test_optimizer: unknown optimizer '" + kind + "'");
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
}

namespace {

// Distinct parameters in registration order (tied weights once), as DDP sees them.
void distinct_params(torch::nn::Module& m, std::vector<std::string>& names,
                     std::vector<torch::Tensor>& params) {
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : m.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      names.push_back(item.key());
      params.push_back(item.value());
    }
  }
}

TrainResult snapshot(torch::nn::Module& m) {
  TrainResult r;
  std::vector<torch::Tensor> params;
  distinct_params(m, r.names, params);
  for (auto& p : params) r.params.push_back(p.detach().cpu().clone());
  for (const auto& item : m.named_buffers()) {
    r.buffer_names.push_back(item.key());
    r.buffers.push_back(item.value().detach().cpu().clone());
  }
  return r;
}

torch::Device spec_device(const TrainSpec& spec) {
  if (spec.device == "cpu") return torch::kCPU;
  require(spec.device == "cuda", "unknown device " + spec.device);
  const char* local_rank = std::getenv("LOCAL_RANK");
  return torch::Device(torch::kCUDA, local_rank ? std::atoi(local_rank) : 0);
}

// Forward and loss, under bf16 autocast when the spec asks for it.
torch::Tensor forward_loss(const TrainSpec& spec, models::Workload& w,
                           const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                           const torch::Tensor& x, const torch::Tensor& y) {
  const torch::Device device = spec_device(spec);
  std::optional<parallel::AutocastGuard> autocast;
  if (spec.autocast_bf16) autocast.emplace(device.type(), torch::kBFloat16);
  return w.loss(forward(x.to(device)), y.to(device));
}

bool has_batchnorm(torch::nn::Module& m) {
  for (const auto& child : m.modules()) {
    if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(child.get())) return true;
  }
  return false;
}

// The distributed twins' workload: the oracle's, with ranks other than 0 perturbed first, so
// that the result also checks that construction broadcasts rank 0's state.
models::Workload twin_workload(const TrainSpec& spec, int rank) {
  models::WorkloadOptions wopts;
  wopts.dim = spec.dim;
  auto w = make_test_workload(spec.model, wopts);
  w.ptr->to(spec_device(spec));
  if (rank != 0) {
    torch::NoGradGuard no_grad;
    for (auto& p : w.ptr->parameters()) p.add_(0.25 * rank);
  }
  return w;
}

// The twins' loop: `spec.steps` steps on this rank's part of each global micro-batch, all but the
// last micro-batch under model.no_sync(). `Model`: any wrapper with operator() and no_sync().
template <typename Model>
void train_steps(const TrainSpec& spec, models::Workload& w, Model& model,
                 torch::optim::Optimizer& opt, int rank, int world, const char* who) {
  auto wrapped = [&](const torch::Tensor& x) { return model(x); };
  // An uneven split would train the ranks on fewer samples than the oracle: a test bug, named.
  TORCH_CHECK(spec.global_batch % world == 0, who, ": global batch ", spec.global_batch,
              " does not split evenly over ", world, " ranks");
  const int64_t shard = spec.global_batch / world;
  int64_t offset = 0;
  for (int step = 0; step < spec.steps; ++step) {
    opt.zero_grad();
    for (int micro = 0; micro < spec.micro_batches; ++micro, offset += spec.global_batch) {
      auto [x, y] = w.batch(offset + rank * shard, shard);
      if (micro + 1 < spec.micro_batches) {
        auto guard = model.no_sync();
        forward_loss(spec, w, wrapped, x, y).backward();
      } else {
        forward_loss(spec, w, wrapped, x, y).backward();
      }
    }
    opt.step();
  }
}

}  // namespace

TrainResult train_single(const TrainSpec& spec, int world) {
  models::WorkloadOptions wopts;
  wopts.dim = spec.dim;
  auto w = make_test_workload(spec.model, wopts);
  w.ptr->to(spec_device(spec));
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  distinct_params(*w.ptr, names, params);
  auto plain = [&](const torch::Tensor& x) { return w.module.forward(x); };
  auto opt = make_test_optimizer(spec.optimizer, params, spec.lr);
  const bool per_shard = has_batchnorm(*w.ptr);
  const int64_t shard = spec.global_batch / world;
  int64_t offset = 0;
  for (int step = 0; step < spec.steps; ++step) {
    opt->zero_grad();
    for (int micro = 0; micro < spec.micro_batches; ++micro, offset += spec.global_batch) {
      if (!per_shard) {
        auto [x, y] = w.batch(offset, spec.global_batch);
        forward_loss(spec, w, plain, x, y).backward();
        continue;
      }
      // BatchNorm: each shard is normalized with its own statistics; running stats end as rank
      // 0's (the ranks > 0 first, each from the saved buffers, then rank 0).
      std::vector<torch::Tensor> saved;
      for (const auto& b : w.ptr->buffers()) saved.push_back(b.detach().clone());
      for (int r = world - 1; r >= 0; --r) {
        {
          torch::NoGradGuard no_grad;
          auto buffers = w.ptr->buffers();
          for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
        }
        auto [x, y] = w.batch(offset + r * shard, shard);
        (forward_loss(spec, w, plain, x, y) / world).backward();
      }
    }
    opt->step();
  }
  return snapshot(*w.ptr);
}

TrainResult train_ddp(const TrainSpec& spec, comm::ProcessGroupPtr pg,
                      const parallel::DDPOptions& options) {
  auto w = twin_workload(spec, pg->rank());
  parallel::DistributedDataParallel<torch::nn::AnyModule> model(w.module, pg, options);
  auto opt = make_test_optimizer(spec.optimizer, model.parameters(), spec.lr);
  train_steps(spec, w, model, *opt, pg->rank(), pg->world_size(), "train_ddp");
  return snapshot(*w.ptr);
}

TrainResult train_data_parallel(const TrainSpec& spec, const comm::DeviceMesh& mesh,
                                parallel::DataParallelStyle style,
                                const parallel::DataParallelOptions& options,
                                hooks::CommHookPtr hook) {
  const comm::ProcessGroupPtr& world = mesh.parent();
  auto w = twin_workload(spec, world->rank());
  auto model = parallel::data_parallel(w.module, mesh, style, options);
  if (hook) model.register_comm_hook(std::move(hook));
  // After wrapping: the sharded styles' parameters are shards now.
  auto opt = make_test_optimizer(spec.optimizer, w.ptr->parameters(), spec.lr);
  train_steps(spec, w, model, *opt, world->rank(), world->world_size(), "train_data_parallel");
  TrainResult r = snapshot(*w.ptr);
  const io::TensorMap whole = io::whole_state(*w.ptr, model.sharding());
  for (size_t i = 0; i < r.names.size(); ++i) r.params[i] = whole.at(r.names[i]).cpu().clone();
  return r;
}

TrainResult initial_params(const TrainSpec& spec) {
  models::WorkloadOptions wopts;
  wopts.dim = spec.dim;
  auto w = make_test_workload(spec.model, wopts);
  return snapshot(*w.ptr);
}

void require_close(const std::vector<std::string>& names, const std::vector<torch::Tensor>& a,
                   const std::vector<torch::Tensor>& b, double rtol, const std::string& context) {
  require(a.size() == b.size(), context + ": tensor counts differ");
  for (size_t i = 0; i < a.size(); ++i) {
    // On the CPU: an export (whole_parameters) is there, a GPU test's oracle on its device.
    const torch::Tensor want = b[i].to(torch::kCPU, torch::kDouble);
    const double ref = want.norm().item<double>();
    const double diff = (a[i].to(torch::kCPU, torch::kDouble) - want).norm().item<double>();
    std::ostringstream msg;
    msg << context << ": '" << names[i] << "' ";
    // Before the difference: a broadcast ([1, 3] against [2, 3]) would hide a wrong shape.
    require(a[i].sizes() == b[i].sizes(), msg.str() + "has a different shape from the oracle's");
    require(ref > 0,
            msg.str() + "is all zeros in the oracle (a comparison on zeros proves nothing)");
    msg << "relative error " << diff / ref << " > " << rtol;
    require(diff / ref <= rtol, msg.str());
  }
}

}  // namespace ddp::testing
