#include "param_tree.hpp"

#include <c10/util/Exception.h>

#include <sstream>

namespace ddp::c_abi {

namespace {

std::vector<std::string> split_name(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream in(name);
  std::string part;
  while (std::getline(in, part, '.')) parts.push_back(part);
  bool valid = !name.empty() && name.back() != '.';
  for (const auto& p : parts) valid = valid && !p.empty();
  TORCH_CHECK(valid, "the name '", name,
              "' is not a qualified parameter name (dot-separated, no empty part)");
  return parts;
}

}  // namespace

std::shared_ptr<torch::nn::Module> param_tree(const std::vector<at::Tensor>& tensors,
                                              const std::vector<std::string>& names) {
  TORCH_CHECK(tensors.size() == names.size(), tensors.size(), " tensors but ", names.size(),
              " names");
  auto root = std::make_shared<torch::nn::Module>("BindingParameters");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<std::string> parts = split_name(names[i]);
    torch::nn::Module* owner = root.get();
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      TORCH_CHECK(owner->named_parameters(/*recurse=*/false).find(parts[k]) == nullptr, "'",
                  names[i], "' lies under '", parts[k], "', which is also a parameter's name");
      std::shared_ptr<torch::nn::Module> child;
      for (const auto& item : owner->named_children()) {
        if (item.key() == parts[k]) child = item.value();
      }
      if (!child) {
        child = owner->register_module(parts[k], std::make_shared<torch::nn::Module>(parts[k]));
      }
      owner = child.get();
    }
    const std::string& leaf = parts.back();
    TORCH_CHECK(owner->named_parameters(/*recurse=*/false).find(leaf) == nullptr, "'", names[i],
                "' is given twice");
    bool is_module = false;
    for (const auto& item : owner->named_children()) is_module |= item.key() == leaf;
    TORCH_CHECK(!is_module, "'", names[i], "' is also the prefix of another name");
    // The same tensor object: register_parameter keeps its requires_grad as passed here.
    owner->register_parameter(leaf, tensors[i], tensors[i].requires_grad());
  }
  return root;
}

}  // namespace ddp::c_abi
