#include "ddp/unit/activation_checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_set>

#include "ddp/autograd/end_of_backward.hpp"
#include "ddp/detail/autocast_compat.hpp"
#include "ddp/detail/capture_rng.hpp"
#include "ddp/intake/module_intake.hpp"

namespace ddp::unit {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One generator and the state it had when forward started. [Note: checkpointing under capture]
// Inside a CUDA graph capture a CUDA generator's state can be neither read nor set, so a forward
// that draws random numbers there could not be replayed with the same draws by its recompute. What
// can be read is the generator's counter within the graph (detail/capture_rng.hpp): a capturing
// generator is kept as that counter instead of a state, a forward that moved it is refused by name
// (the capture then falls back to eager steps, CapturedStep's rule for what a replay cannot
// repeat), and one that did not needs nothing restored: its recompute draws nothing either.
struct SavedRng {
  at::Generator generator;
  at::Tensor state;                        // undefined while capturing
  std::optional<uint64_t> capture_offset;  // the counter within the graph, while capturing
};

// The generators forward may draw from: the default CPU one, and the default CUDA one of every
// device an input or parameter lives on (fn's kernels run there). CUDA is reached through the
// global context, so this compiles against a CPU-only libtorch.
std::vector<at::Generator> generators_of(const std::vector<at::Tensor>& inputs,
                                         const std::vector<at::Tensor>& params) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  std::set<c10::DeviceIndex> cuda;
  for (const auto* list : {&inputs, &params}) {
    for (const auto& t : *list) {
      if (t.defined() && t.is_cuda()) cuda.insert(t.get_device());
    }
  }
  for (const auto index : cuda) {
    out.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, index)));
  }
  return out;
}

// Generator methods are not thread-safe: libtorch asks callers to hold the generator's mutex.
std::vector<SavedRng> get_rng_states(const std::vector<at::Generator>& generators) {
  std::vector<SavedRng> out;
  for (auto gen : generators) {
    if (const auto offset = detail::capture_rng_offset(gen)) {
      out.push_back({gen, at::Tensor(), offset});
      continue;
    }
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back({gen, gen.get_state(), std::nullopt});
  }
  return out;
}

void set_rng_states(const std::vector<SavedRng>& saved) {
  for (auto s : saved) {
    if (s.capture_offset) continue;  // [Note: checkpointing under capture]: nothing was drawn
    std::lock_guard<std::mutex> lock(s.generator.mutex());
    s.generator.set_state(s.state);
  }
}

// [Note: checkpointing under capture] `when` is "forward" or "the recompute".
void check_no_draw_under_capture(const std::vector<SavedRng>& saved, const char* when) {
  for (const auto& s : saved) {
    if (!s.capture_offset) continue;
    const auto now = detail::capture_rng_offset(s.generator);
    TORCH_CHECK(!now || *now == *s.capture_offset, "ddp::activation_checkpoint: the checkpointed ",
                "function drew random numbers on ", s.generator.device(), " in ", when,
                " during a CUDA graph capture (dropout?); a generator cannot be set back inside a ",
                "capture, so its recompute would draw other numbers. Checkpoint blocks that draw ",
                "none (dropout 0) in a captured step, or run the step eagerly");
  }
}

struct AutocastState {
  bool enabled;
  c10::ScalarType dtype;
};

// What backward needs besides the saved inputs. Held by the node through a capsule in
// ctx->saved_data (the only non-tensor storage a custom Function has).
struct CheckpointState : torch::CustomClassHolder {
  CheckpointMultiFn fn;
  std::vector<at::Tensor> params;  // distinct, requiring grad; the node's inputs after `inputs`
  std::vector<SavedRng> rng;       // states before forward's first draw
  AutocastState cpu_autocast{}, cuda_autocast{};
  std::vector<std::vector<int64_t>> output_sizes;  // forward's, to check the recompute
};

// Sets an autocast state for a scope and restores the previous one. Nesting is counted as in
// Python's autocast: casts of weights cached during the recompute are dropped when the outermost
// scope closes, so the next forward casts the updated weights.
class AutocastScope {
 public:
  AutocastScope(AutocastState cpu, AutocastState cuda)
      : cpu_{detail::autocast_enabled(c10::kCPU), detail::autocast_dtype(c10::kCPU)},
        cuda_{detail::autocast_enabled(c10::kCUDA), detail::autocast_dtype(c10::kCUDA)} {
    at::autocast::increment_nesting();
    detail::set_autocast(c10::kCPU, cpu.enabled, cpu.dtype);
    detail::set_autocast(c10::kCUDA, cuda.enabled, cuda.dtype);
  }
  ~AutocastScope() {
    detail::set_autocast(c10::kCPU, cpu_.enabled, cpu_.dtype);
    detail::set_autocast(c10::kCUDA, cuda_.enabled, cuda_.dtype);
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState cpu_, cuda_;
};

std::string sizes_text(const std::vector<std::vector<int64_t>>& sizes) {
  std::ostringstream out;
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << c10::IntArrayRef(sizes[i]);
  return out.str();
}

// torch::autograd::grad computes gradients only for `wrt`: a leaf that fn reads but that is not
// a parameter of the module it was given would silently get no gradient. Walks the recomputed
// graph (the block only: it stops at leaves) and refuses such a leaf.
void check_no_undeclared_leaf(const variable_list& roots, const variable_list& wrt) {
  std::unordered_set<const c10::TensorImpl*> declared;
  for (const auto& t : wrt) declared.insert(t.unsafeGetTensorImpl());
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& r : roots) {
    if (r.grad_fn()) stack.push_back(r.grad_fn().get());
  }
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      TORCH_CHECK(declared.count(leaf->variable.unsafeGetTensorImpl()),
                  "ddp::activation_checkpoint: the checkpointed function reads a tensor of sizes ",
                  leaf->variable.sizes(), " that requires grad but is neither an input nor a ",
                  "parameter of the module passed to checkpoint, so it would get no gradient; ",
                  "pass the module that owns it (a parent of every module fn calls)");
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
}

// [Note: the recompute's last projection] The recompute running on this thread (the innermost of
// nested checkpoints) and the output_linear nodes it made.
struct Recompute {
  std::unordered_set<const torch::autograd::Node*> value_free;
};
thread_local Recompute* current_recompute = nullptr;

class RecomputeScope {
 public:
  explicit RecomputeScope(Recompute* recompute) : previous_(current_recompute) {
    current_recompute = recompute;
  }
  ~RecomputeScope() { current_recompute = previous_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  Recompute* previous_;
};

// Nodes whose backward reads no forward values: what may lie between fn's outputs and an
// output_linear node. Named as libtorch 1.13 and 2.x name them.
bool reads_no_values(const torch::autograd::Node& node) {
  static const std::unordered_set<std::string> kinds{
      "AddBackward0",        "AddBackward1",
      "SubBackward0",        "SubBackward1",
      "ToCopyBackward0",     "ViewBackward0",
      "UnsafeViewBackward0", "ReshapeAliasBackward0",
      "CloneBackward0",      "ddp::tp::ReduceFromRegion"};
  return kinds.count(node.name()) > 0;
}

// Every path from `roots` to a node of `recompute.value_free` runs through nodes that read no
// values; otherwise the gradient through that node would be computed from the zeros it output.
void check_value_free_paths(const variable_list& roots, const Recompute& recompute) {
  using torch::autograd::Node;
  // (node, the last node on the way there whose backward reads values, or null)
  std::vector<std::pair<Node*, Node*>> stack;
  std::set<std::pair<Node*, Node*>> seen;
  for (const auto& r : roots) {
    if (r.grad_fn()) stack.emplace_back(r.grad_fn().get(), nullptr);
  }
  while (!stack.empty()) {
    auto [node, reader] = stack.back();
    stack.pop_back();
    if (!seen.insert({node, reader}).second) continue;
    const bool skipped = recompute.value_free.count(node) > 0;
    if (skipped) {
      TORCH_CHECK(reader == nullptr, "ddp::activation_checkpoint: a projection the recompute ",
                  "skips (output_linear: a block's last projection) reaches the checkpointed ",
                  "function's output through ", reader->name(),
                  ", whose backward reads values, so its gradient would be computed from zeros; ",
                  "checkpoint each block on its own, or call at::linear there");
    }
    // A skipped projection's node reads its input and weight: what lies beyond it is read.
    Node* next_reader = skipped || !reads_no_values(*node) ? node : reader;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.emplace_back(edge.function.get(), next_reader);
    }
  }
}

// [Note: the recompute's last projection] A bias-free linear's node over zeros: at::linear's
// gradients (mm's backward formulas, the same calls) from the saved input and weight. The bias is
// added outside it (an addition, which reads no values): torch 2.x's custom Functions take no
// undefined input.
struct OutputLinearFunction : torch::autograd::Function<OutputLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight) {
    ctx->save_for_backward({input, weight});
    std::vector<int64_t> sizes = input.sizes().vec();
    sizes.back() = weight.size(0);
    return at::zeros(sizes, input.options());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});
    variable_list out(2);
    if (ctx->needs_input_grad(0)) out[0] = g.mm(weight).view(input.sizes());
    if (ctx->needs_input_grad(1)) out[1] = g.t().mm(input.reshape({-1, input.size(-1)}));
    return out;
  }
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // apply() has turned grad mode off already: fn builds no graph and keeps no activations.
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<CheckpointState>& st,
                               at::TensorList inputs, at::TensorList /*params*/) {
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    auto outputs = st->fn(in);
    check_no_draw_under_capture(st->rng, "forward");
    TORCH_CHECK(!outputs.empty(),
                "ddp::activation_checkpoint: the checkpointed function returned no tensor");
    variable_list non_differentiable;
    for (size_t i = 0; i < outputs.size(); ++i) {
      TORCH_CHECK(outputs[i].defined(),
                  "ddp::activation_checkpoint: the checkpointed function returned an ",
                  "undefined tensor at output ", i,
                  "; return defined tensors (compute optional values outside the checkpoint)");
      st->output_sizes.push_back(outputs[i].sizes().vec());
      if (!at::isFloatingType(outputs[i].scalar_type()) &&
          !at::isComplexType(outputs[i].scalar_type())) {
        non_differentiable.push_back(outputs[i]);
      }
    }
    ctx->mark_non_differentiable(non_differentiable);
    // An output's incoming gradient may be undefined (the loss did not use it): those outputs
    // are left out of the recompute's grad rather than given zeros.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(in);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The engine runs a node's backward with grad mode = create_graph.
    TORCH_CHECK(
        !c10::GradMode::is_enabled(),
        "ddp::activation_checkpoint: backward with create_graph=true (double backward) through a "
        "checkpoint is not supported: the recompute's gradients carry no graph");
    auto st = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data.at("state").toCapsule());
    const auto saved = ctx->get_saved_variables();  // checks that no input changed in place
    std::vector<at::Tensor> inputs;
    for (const auto& t : saved) inputs.push_back(t.detach().requires_grad_(t.requires_grad()));

    std::vector<at::Tensor> outputs;
    Recompute recompute;
    {
      std::vector<at::Generator> generators;
      for (const auto& s : st->rng) generators.push_back(s.generator);
      const auto now = get_rng_states(generators);
      set_rng_states(st->rng);
      try {
        c10::AutoGradMode grad_on(true);
        AutocastScope autocast(st->cpu_autocast, st->cuda_autocast);
        RecomputeScope scope(&recompute);
        outputs = st->fn(inputs);
      } catch (...) {
        set_rng_states(now);
        throw;
      }
      check_no_draw_under_capture(now, "the recompute");
      // RNG use after the checkpoint sees the stream as if fn had run once.
      set_rng_states(now);
    }
    std::vector<std::vector<int64_t>> sizes;
    for (const auto& o : outputs) {
      sizes.push_back(o.defined() ? o.sizes().vec() : std::vector<int64_t>{-1});
    }
    TORCH_CHECK(sizes == st->output_sizes,
                "ddp::activation_checkpoint: the recompute returned outputs of sizes [",
                sizes_text(sizes), "] but forward returned [", sizes_text(st->output_sizes),
                "]; the checkpointed function must compute the same outputs from the same inputs");

    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    variable_list wrt;  // positions in the node's inputs, after the capsule
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        wrt_index.push_back(1 + i);
      }
    }
    for (size_t i = 0; i < st->params.size(); ++i) {
      wrt.push_back(st->params[i]);
      wrt_index.push_back(1 + inputs.size() + i);
    }
    variable_list result(1 + inputs.size() + st->params.size());
    if (roots.empty()) return result;
    check_no_undeclared_leaf(roots, wrt);
    if (!recompute.value_free.empty()) check_value_free_paths(roots, recompute);
    // The recompute's backward is part of this one: what its hooks ask for at the end of backward
    // (a sharded unit's reshard, TP's forward count) waits for the end of the outer backward.
    variable_list grads;
    {
      ddp::autograd::NestedBackward nested;
      grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    for (size_t k = 0; k < grads.size(); ++k) result[wrt_index[k]] = grads[k];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> activation_checkpoint(torch::nn::Module& module,
                                              const CheckpointMultiFn& fn,
                                              const std::vector<at::Tensor>& inputs) {
  // A parameter listed twice (tied weights: libtorch does not deduplicate) would get its
  // gradient twice; frozen parameters need no slot.
  const std::vector<at::Tensor> params = intake::take_in(module).trainable_params();
  bool any_requires_grad = !params.empty();
  for (const auto& t : inputs) any_requires_grad |= t.defined() && t.requires_grad();
  if (!c10::GradMode::is_enabled() || !any_requires_grad) return fn(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].defined(), "ddp::activation_checkpoint: input ", i,
                " is undefined; pass defined tensors (capture optional ones in fn)");
  }

  auto st = c10::make_intrusive<CheckpointState>();
  st->fn = fn;
  st->params = params;
  st->rng = get_rng_states(generators_of(inputs, params));
  st->cpu_autocast = {detail::autocast_enabled(c10::kCPU), detail::autocast_dtype(c10::kCPU)};
  st->cuda_autocast = {detail::autocast_enabled(c10::kCUDA), detail::autocast_dtype(c10::kCUDA)};
  return CheckpointFunction::apply(st, at::TensorList(inputs), at::TensorList(params));
}

at::Tensor output_linear(const at::Tensor& input, const at::Tensor& weight,
                         const at::Tensor& bias) {
  if (current_recompute == nullptr || !c10::GradMode::is_enabled()) {
    return at::linear(input, weight, bias);
  }
  // autocast's casts, which at::linear would make inside (a lower-precision op): the node then
  // saves and computes in the dtype the real linear's backward would.
  const auto device = input.device().type();
  const auto cast = [&](const at::Tensor& t) {
    const bool eligible = t.defined() && at::isFloatingType(t.scalar_type()) &&
                          t.scalar_type() != at::kDouble;  // autocast leaves float64 alone
    if (!eligible || !detail::autocast_enabled(device)) return t;
    return t.to(detail::autocast_dtype(device));
  };
  const at::Tensor out = OutputLinearFunction::apply(cast(input), cast(weight));
  if (out.grad_fn()) current_recompute->value_free.insert(out.grad_fn().get());
  return bias.defined() ? out + cast(bias) : out;
}

at::Tensor activation_checkpoint(torch::nn::Module& module, const CheckpointFn& fn,
                                 const at::Tensor& input) {
  // By value: the node calls it again in backward, after the caller's fn may be gone.
  const CheckpointMultiFn multi = [fn](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{fn(in[0])};
  };
  return activation_checkpoint(module, multi, std::vector<at::Tensor>{input})[0];
}

}  // namespace ddp::unit
