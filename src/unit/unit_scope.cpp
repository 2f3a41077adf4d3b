#include "ddp/unit/unit_scope.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace ddp::unit {
namespace {

struct Entry {
  UnitListener* listener = nullptr;
  size_t unit = 0;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
// Per module, its listeners in registration order.
std::unordered_map<const torch::nn::Module*, std::vector<Entry>>& registry() {
  static std::unordered_map<const torch::nn::Module*, std::vector<Entry>> r;
  return r;
}

}  // namespace

UnitRegistration::UnitRegistration(const torch::nn::Module& module, UnitListener& listener,
                                   size_t unit)
    : module_(&module), listener_(&listener) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<Entry>& entries = registry()[module_];
  for (const Entry& e : entries) {
    TORCH_CHECK(e.listener->kind() != listener.kind(),
                "ddp: this submodule is already a unit of another ", listener.kind(),
                " wrapper; wrap a model once");
  }
  entries.push_back(Entry{&listener, unit});
}

UnitRegistration::~UnitRegistration() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(module_);
  if (it == registry().end()) return;
  auto& entries = it->second;
  for (auto e = entries.begin(); e != entries.end(); ++e) {
    if (e->listener == listener_) {
      entries.erase(e);
      break;
    }
  }
  if (entries.empty()) registry().erase(it);
}

bool is_unit_of(const torch::nn::Module& module, std::string_view kind) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(&module);
  if (it == registry().end()) return false;
  for (const Entry& e : it->second) {
    if (e.listener->kind() == kind) return true;
  }
  return false;
}

bool any_unit_of(std::string_view kind) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& [module, entries] : registry()) {
    for (const Entry& e : entries) {
      if (e.listener->kind() == kind) return true;
    }
  }
  return false;
}

at::Tensor run_unit(const torch::nn::Module& module,
                    const std::function<at::Tensor(const at::Tensor&)>& fn,
                    const at::Tensor& input) {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    const auto it = registry().find(&module);
    if (it != registry().end()) entries = it->second;
  }
  if (entries.empty()) return fn(input);
  // [Note: nested unit listeners]: the last registered is the outermost.
  at::Tensor in = input;
  for (auto e = entries.rbegin(); e != entries.rend(); ++e) {
    in = e->listener->before_unit_forward(e->unit, in);
  }
  at::Tensor out = fn(in);
  for (const Entry& e : entries) out = e.listener->after_unit_forward(e.unit, out);
  return out;
}

}  // namespace ddp::unit
