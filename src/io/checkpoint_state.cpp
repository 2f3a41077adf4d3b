#include "ddp/io/checkpoint_state.hpp"

#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "ddp/detail/optimizer_state_key.hpp"
#include "ddp/optim/device_step.hpp"

namespace ddp::io {
namespace {

using StateMap = detail::OptimizerStateMap;  // [Note: optimizer state keys]

// Optimizer parameters are named by the model: the first name under which each appears.
std::unordered_map<const c10::TensorImpl*, std::string> parameter_names(
    const torch::nn::Module& model) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters())
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

const std::string& name_of(const std::unordered_map<const c10::TensorImpl*, std::string>& names,
                           const at::Tensor& param, size_t group, size_t index) {
  const auto it = names.find(param.unsafeGetTensorImpl());
  TORCH_CHECK(it != names.end(), "ddp: checkpoint: parameter ", index, " of optimizer group ",
              group, " (shape ", param.sizes(),
              ") is not a parameter of the model; a checkpoint names optimizer state by the "
              "model's parameter names, so build the optimizer from model->parameters()");
  return it->second;
}

// `t` as the state of `param`: same shape, on the parameter's device and dtype, a private copy.
at::Tensor state_like(const at::Tensor& t, const at::Tensor& param, const std::string& key,
                      const std::string& source) {
  TORCH_CHECK(t.sizes() == param.sizes(), "ddp: checkpoint ", source, ": optimizer state '", key,
              "' has shape ", t.sizes(), " but the parameter has shape ", param.sizes());
  return t.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

TensorMap model_tensors(const torch::nn::Module& model) {
  TensorMap out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach();
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value().detach();
  return out;
}

namespace {

std::map<std::string, at::Tensor> model_targets(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : model.named_parameters()) targets[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) targets[item.key()] = item.value();
  return targets;
}

}  // namespace

void check_model_tensors(const torch::nn::Module& model, const TensorMap& tensors,
                         const std::string& source) {
  const auto targets = model_targets(model);
  for (const auto& [name, target] : targets) {
    const auto it = tensors.find(name);
    TORCH_CHECK(it != tensors.end(), "ddp: checkpoint ", source, " has no tensor '", name,
                "' that the model has (", tensors.size(),
                " tensors in the file): was it saved from another model?");
    TORCH_CHECK(it->second.sizes() == target.sizes(), "ddp: checkpoint ", source, ": tensor '",
                name, "' has shape ", it->second.sizes(), " but the model's has shape ",
                target.sizes());
    TORCH_CHECK(it->second.scalar_type() == target.scalar_type(), "ddp: checkpoint ", source,
                ": tensor '", name, "' has dtype ", it->second.scalar_type(),
                " but the model's has dtype ", target.scalar_type());
  }
  for (const auto& [name, t] : tensors)
    TORCH_CHECK(targets.count(name) == 1, "ddp: checkpoint ", source, " has tensor '", name,
                "' that the model does not have: was it saved from another model?");
}

void load_model_tensors(torch::nn::Module& model, const TensorMap& tensors,
                        const std::string& source) {
  // Every check before the first copy: a refused checkpoint leaves the model as it was.
  check_model_tensors(model, tensors, source);
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : model_targets(model)) target.copy_(tensors.at(name));
}

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return "sgd";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) return "adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return "adamw";
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr) return "rmsprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr) return "adagrad";
  TORCH_CHECK(false,
              "ddp: checkpoint: only the state of torch::optim's SGD, Adam, AdamW, RMSprop and "
              "Adagrad can be saved; this optimizer is none of them");
}

namespace {

// [Note: optimizer state fields] One parameter's state as named fields, the names PyTorch's
// state_dict uses: `step` an int64 scalar (a count, not parameter-shaped), the rest tensors of
// the parameter's shape (a sharded checkpoint splits them as the parameter). Optional fields
// (SGD without momentum, AMSGrad's maximum, RMSprop's momentum and centered average) are absent
// when undefined. Each kind's fields are written and read by the one pair of functions below.
template <typename State>
struct Fields;

template <>
struct Fields<torch::optim::SGDParamState> {
  template <typename F>
  static void each(torch::optim::SGDParamState& s, F&& f) {
    f(
        "momentum_buffer", false, [&] { return s.momentum_buffer(); },
        [&](const at::Tensor& t) { s.momentum_buffer(t); });
  }
};

// Adam and AdamW keep the same fields.
template <typename AdamState>
struct AdamFields {
  template <typename F>
  static void each(AdamState& s, F&& f) {
    f(
        "exp_avg", true, [&] { return s.exp_avg(); }, [&](const at::Tensor& t) { s.exp_avg(t); });
    f(
        "exp_avg_sq", true, [&] { return s.exp_avg_sq(); },
        [&](const at::Tensor& t) { s.exp_avg_sq(t); });
    f(
        "max_exp_avg_sq", false, [&] { return s.max_exp_avg_sq(); },
        [&](const at::Tensor& t) { s.max_exp_avg_sq(t); });
  }
};
template <>
struct Fields<torch::optim::AdamParamState> : AdamFields<torch::optim::AdamParamState> {};
template <>
struct Fields<torch::optim::AdamWParamState> : AdamFields<torch::optim::AdamWParamState> {};

template <>
struct Fields<torch::optim::RMSpropParamState> {
  template <typename F>
  static void each(torch::optim::RMSpropParamState& s, F&& f) {
    f(
        "square_avg", true, [&] { return s.square_avg(); },
        [&](const at::Tensor& t) { s.square_avg(t); });
    f(
        "momentum_buffer", false, [&] { return s.momentum_buffer(); },
        [&](const at::Tensor& t) { s.momentum_buffer(t); });
    f(
        "grad_avg", false, [&] { return s.grad_avg(); },
        [&](const at::Tensor& t) { s.grad_avg(t); });
  }
};

template <>
struct Fields<torch::optim::AdagradParamState> {
  template <typename F>
  static void each(torch::optim::AdagradParamState& s, F&& f) {
    f(
        "sum", true, [&] { return s.sum(); }, [&](const at::Tensor& t) { s.sum(t); });
  }
};

// Whether State counts steps (SGD does not).
template <typename State>
constexpr bool kHasStep = !std::is_same_v<State, torch::optim::SGDParamState>;

template <typename State>
void save_state(torch::optim::OptimizerParamState& base, const std::string& name, TensorMap& out) {
  auto& s = static_cast<State&>(base);
  if constexpr (kHasStep<State>)
    out[name + ".step"] = at::scalar_tensor(int64_t(s.step()), at::kLong);
  Fields<State>::each(s, [&](const char* field, bool, auto get, auto) {
    const at::Tensor t = get();
    if (t.defined()) out[name + "." + field] = t.detach();
  });
}

// The state of parameter `p` from `take` (nullptr: absent) and `require` (throws naming the key),
// or nullptr when the checkpoint holds none for it (not stepped when saved).
template <typename State, typename Take, typename Require, typename Like>
std::unique_ptr<torch::optim::OptimizerParamState> load_state(const std::string& name,
                                                              const std::string& source,
                                                              Take&& take, Require&& require,
                                                              Like&& like) {
  auto s = std::make_unique<State>();
  bool any = false;
  if constexpr (kHasStep<State>) {
    const at::Tensor* step = take(name + ".step");
    if (step == nullptr) return nullptr;
    TORCH_CHECK(step->numel() == 1 && step->scalar_type() == at::kLong, "ddp: checkpoint ", source,
                ": optimizer state '", name, ".step' is not an int64 scalar");
    s->step(step->template item<int64_t>());
    any = true;
  }
  Fields<State>::each(*s, [&](const char* field, bool required, auto, auto set) {
    const std::string key = name + "." + field;
    const at::Tensor* t = required && any ? &require(key) : take(key);
    if (t == nullptr) return;
    set(like(*t, key));
    any = true;
  });
  if (!any) return nullptr;
  return s;
}

template <typename State>
struct StateType {
  using type = State;
};

// Calls `f` with StateType<the per-parameter state class of `kind`> (an optimizer_kind name).
template <typename F>
void with_state_type(const std::string& kind, F&& f) {
  if (kind == "sgd") {
    f(StateType<torch::optim::SGDParamState>{});
  } else if (kind == "adam") {
    f(StateType<torch::optim::AdamParamState>{});
  } else if (kind == "adamw") {
    f(StateType<torch::optim::AdamWParamState>{});
  } else if (kind == "rmsprop") {
    f(StateType<torch::optim::RMSpropParamState>{});
  } else {
    f(StateType<torch::optim::AdagradParamState>{});
  }
}

}  // namespace

TensorMap optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& model) {
  const std::string kind = optimizer_kind(optimizer);
  // Ours count steps on the device: the count into each state's `step` first (a host read).
  if (auto* device = dynamic_cast<optim::DeviceStep*>(&optimizer)) device->steps_to_state();
  const auto names = parameter_names(model);
  StateMap& state = optimizer.state();
  TensorMap out;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      const std::string& name = name_of(names, p, g, i);
      const auto it = state.find(detail::optimizer_state_key(p));
      if (it == state.end()) continue;  // not stepped yet
      with_state_type(kind, [&](auto type) {
        save_state<typename decltype(type)::type>(*it->second, name, out);
      });
    }
  }
  return out;
}

void load_optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& model,
                            const TensorMap& tensors, const std::string& source) {
  const std::string kind = optimizer_kind(optimizer);
  const auto names = parameter_names(model);
  std::set<std::string> used;
  const auto take = [&](const std::string& key) -> const at::Tensor* {
    const auto it = tensors.find(key);
    if (it == tensors.end()) return nullptr;
    used.insert(key);
    return &it->second;
  };
  const auto require = [&](const std::string& key) -> const at::Tensor& {
    const at::Tensor* t = take(key);
    TORCH_CHECK(t != nullptr, "ddp: checkpoint ", source, " is missing optimizer state '", key,
                "'");
    return *t;
  };
  // Built aside and swapped in at the end: a refused file leaves the optimizer as it was.
  StateMap fresh;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      const std::string& name = name_of(names, p, g, i);
      const auto like = [&](const at::Tensor& t, const std::string& key) {
        return state_like(t, p, key, source);
      };
      std::unique_ptr<torch::optim::OptimizerParamState> s;
      with_state_type(kind, [&](auto type) {
        s = load_state<typename decltype(type)::type>(name, source, take, require, like);
      });
      if (s) fresh[detail::optimizer_state_key(p)] = std::move(s);
    }
  }
  for (const auto& [key, t] : tensors)
    TORCH_CHECK(used.count(key) == 1, "ddp: checkpoint ", source, " has optimizer state '", key,
                "' that matches no parameter of this ", kind,
                " optimizer: was it saved from another model or optimizer?");
  optimizer.state() = std::move(fresh);
  if (auto* device = dynamic_cast<optim::DeviceStep*>(&optimizer)) device->steps_from_state();
}

TensorMap rng_tensors() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return {{"cpu", gen.get_state()}};
}

void check_rng_tensors(const TensorMap& tensors, const std::string& source) {
  const auto it = tensors.find("cpu");
  TORCH_CHECK(it != tensors.end(), "ddp: checkpoint ", source, " has no 'cpu' generator state");
  const at::Tensor current = rng_tensors().at("cpu");
  TORCH_CHECK(
      it->second.scalar_type() == current.scalar_type() && it->second.numel() == current.numel(),
      "ddp: checkpoint ", source, ": the 'cpu' generator state has ", it->second.numel(),
      " elements of ", it->second.scalar_type(), ", this libtorch's has ", current.numel(), " of ",
      current.scalar_type());
}

void load_rng_tensors(const TensorMap& tensors, const std::string& source) {
  check_rng_tensors(tensors, source);
  const auto it = tensors.find("cpu");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(it->second);
}

}  // namespace ddp::io
