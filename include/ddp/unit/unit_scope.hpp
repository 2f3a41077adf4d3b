#pragma once
// Unit boundaries in a model's forward. The C++ frontend has no forward hooks on nn::Module, so a
// sharded runtime cannot run code "before unit h.3's forward" on its own: the model says where a
// unit's forward is, with one call around the submodule's forward,
//
//   x = ddp::unit::run_unit(*block, [&](const at::Tensor& in) { return block->forward(in); }, x);
//
// Without a sharded wrapper that has `block` as a unit, run_unit is fn(x): the model stays a plain
// model, trains alone, under DDP and in tests. With one (ShardedModule registers its units here),
//
//   before fn    the runtime gathers the unit's parameters (and may prefetch the next unit), and
//                may cast a floating-point input to the gathered parameters' dtype
//   after fn     the runtime may release them again (reshard_after_forward), and a node on the
//                output calls the runtime back when the output's gradient arrives: just before the
//                unit's own backward, when its parameters must be gathered again
//
// The lookup is by module address in a process-wide registry, not a thread-local, because a
// recompute (activation checkpointing) runs fn again inside backward, on an autograd thread.
//
// [Note: a unit's parameters stay inside its run_unit] Between its forward and its backward a
// released unit's parameters keep their shapes but have no memory behind them; code that reads
// them outside run_unit (another unit using them, or the root) reads released memory. Parameters
// shared between units must be registered under a name in each user (tied weights are): the shard
// plan then puts them in the unit that contains every name (the root at worst), which stays
// gathered.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace ddp::unit {

// [Note: nested unit listeners] One module may be a unit of several runtimes of different kinds
// (tensor parallelism shards a Linear's weight and wraps its input and output; a sharded
// data-parallel wrapper gathers that weight). They nest in registration order, the last registered
// outermost, as wrapping applies them: before fn the outermost runs first (gather the parameters,
// then transform the input), after fn the innermost (all-reduce the output, then put the
// data-parallel backward node on the result, so that in backward the gather comes first).

// What a runtime does at unit boundaries; `unit` is the index it registered.
class UnitListener {
 public:
  virtual ~UnitListener() = default;
  // What kind of runtime this is ("sharded data-parallel", "tensor-parallel"): a module is a unit
  // of at most one runtime of each kind.
  virtual const char* kind() const = 0;
  // Returns the input fn will get (the runtime may cast it: param_dtype).
  virtual at::Tensor before_unit_forward(size_t unit, const at::Tensor& input) = 0;
  // Returns the output, possibly with a node attached (on_backward) that will call back.
  virtual at::Tensor after_unit_forward(size_t unit, const at::Tensor& output) = 0;
};

// While alive, run_unit(module, ...) calls `listener` with `unit`. A module is a unit of at most
// one runtime of a kind: a second registration of that kind throws naming the kind (the module has
// no name of its own), as wrapping one model twice would gather its parameters twice.
class UnitRegistration {
 public:
  UnitRegistration(const torch::nn::Module& module, UnitListener& listener, size_t unit);
  ~UnitRegistration();
  UnitRegistration(const UnitRegistration&) = delete;
  UnitRegistration& operator=(const UnitRegistration&) = delete;

 private:
  const torch::nn::Module* module_;
  const UnitListener* listener_;
};

// Whether `module` is a unit of a live runtime of `kind` (UnitListener::kind()): lets a caller
// that needs a runtime's knowledge (a tensor-parallel split) refuse to go on without it.
bool is_unit_of(const torch::nn::Module& module, std::string_view kind);
// Whether any module is a unit of a live runtime of `kind`: one look at the registry, so that a
// per-step check costs nothing in the runs without such a runtime.
bool any_unit_of(std::string_view kind);

// fn(input) as a unit's forward (see above).
at::Tensor run_unit(const torch::nn::Module& module,
                    const std::function<at::Tensor(const at::Tensor&)>& fn,
                    const at::Tensor& input);

}  // namespace ddp::unit
