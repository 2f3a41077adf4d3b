#pragma once
// For the model zoo and the test nets: re-points a registered parameter at another tensor (weight
// tying).

#include <string>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

namespace ddp::models::detail {

// libtorch has no unregister_parameter and register_parameter refuses a name that is taken, so a
// tied weight has to be swapped in the parameter table itself. Module::parameters_ is protected;
// naming it through a derived class yields a member pointer usable on any Module, which is the
// standard-conforming way to reach it. The entry keeps its position, so parameter order is
// unchanged by tying.
inline void replace_parameter(torch::nn::Module& module, const std::string& name,
                              const torch::Tensor& tensor) {
  struct Access : torch::nn::Module {
    static torch::OrderedDict<std::string, torch::Tensor>& table(torch::nn::Module& m) {
      return m.*(&Access::parameters_);
    }
  };
  auto& table = Access::table(module);
  TORCH_CHECK(table.contains(name), "replace_parameter: module ", module.name(),
              " has no parameter '", name, "' to replace");
  TORCH_CHECK(tensor.requires_grad(), "replace_parameter: the tensor for '", name,
              "' must require grad, like the parameter it replaces");
  table[name] = tensor;
}

}  // namespace ddp::models::detail
