#pragma once
// TypedModule<M, Wrapper>: the user's module as its own type, and its forward through a wrapper's
// forward protocol (WrappedForward, wrap/wrapped_model.hpp), written once for the typed wrappers
// DistributedDataParallel<M>, FullyShardedDataParallel<M> and DataParallel<M>. `Wrapper` (the
// derived class) answers wrapped(): the runtime whose protocol the forward runs in (itself, or
// the runtime it holds), so `model(x)` and `model.module()` read alike under every wrapper.

#include <utility>

#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::wrap {

template <typename ModuleType, typename Wrapper>
class TypedModule {
 public:
  // The module's own forward, any signature and output structure, inside the wrapper's protocol.
  template <typename... Args>
  auto forward(Args&&... args) {
    return WrappedForward::run(static_cast<Wrapper&>(*this).wrapped(), module_,
                               std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  ModuleType& module() { return module_; }

 protected:
  // A copy of the user's handle (ModuleHolder, shared_ptr, AnyModule: the same module), so that
  // the derived wrapper can still read the argument while it builds its runtime.
  explicit TypedModule(const ModuleType& module) : module_(module) {}

 private:
  ModuleType module_;
};

}  // namespace ddp::wrap
