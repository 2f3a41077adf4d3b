#pragma once
// A binding's parameters as a torch::nn::Module, so that the library's wrappers and checkpoints
// (which read a module's named parameters) take them unchanged: "fc1.weight" becomes parameter
// "weight" of a submodule "fc1". The tensors are registered as they are (the same TensorImpl, so
// the hooks the wrapper installs are the binding's tensors' hooks), never copied.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace ddp::c_abi {

// Refused by name (the boundary adds the calling function): an empty name, an empty dotted
// component, a name given twice, or one that is both a parameter and a prefix of another ("fc"
// and "fc.weight").
std::shared_ptr<torch::nn::Module> param_tree(const std::vector<at::Tensor>& tensors,
                                              const std::vector<std::string>& names);

}  // namespace ddp::c_abi
