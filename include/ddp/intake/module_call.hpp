#pragma once
// What a data-parallel wrapper needs to call the module it wraps, whatever the user handed it: a
// module holder (Net), a shared_ptr to an Impl, or a torch::nn::AnyModule; and to find the tensors
// in whatever the forward returned (a tensor, a vector, a pair, a tuple, or nothing it can use),
// to walk the graph from them or to hang a node on each. Every wrapper (DistributedDataParallel,
// FullyShardedDataParallel, DataParallel over both) accepts the same modules and outputs.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp::intake {

inline std::shared_ptr<torch::nn::Module> as_module_ptr(const torch::nn::AnyModule& m) {
  return m.ptr();
}
template <typename M>
std::shared_ptr<torch::nn::Module> as_module_ptr(const std::shared_ptr<M>& m) {
  return m;
}
template <typename Holder>
auto as_module_ptr(const Holder& m) -> decltype(std::shared_ptr<torch::nn::Module>(m.ptr())) {
  return m.ptr();
}

template <typename... Args>
decltype(auto) call_forward(torch::nn::AnyModule& m, Args&&... args) {
  return m.forward(std::forward<Args>(args)...);
}
template <typename M, typename... Args>
decltype(auto) call_forward(M& m, Args&&... args) {
  return m->forward(std::forward<Args>(args)...);
}

// The tensors in a forward's result, in order.
inline void collect(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename A, typename B>
void collect(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect(p.first, out);
  collect(p.second, out);
}
template <typename... Ts>
void collect(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect(e, out), ...); }, t);
}
template <typename T>
void collect(const T&, std::vector<at::Tensor>&) {}  // not a tensor: nothing in it

// The forward's result with every tensor in it replaced by fn(tensor), the same structure.
template <typename Fn>
at::Tensor map_tensors(const at::Tensor& t, Fn& fn) {
  return fn(t);
}
template <typename Fn>
std::vector<at::Tensor> map_tensors(const std::vector<at::Tensor>& ts, Fn& fn) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(fn(t));
  return out;
}
template <typename A, typename B, typename Fn>
auto map_tensors(const std::pair<A, B>& p, Fn& fn) {
  return std::make_pair(map_tensors(p.first, fn), map_tensors(p.second, fn));
}
template <typename... Ts, typename Fn>
auto map_tensors(const std::tuple<Ts...>& t, Fn& fn) {
  return std::apply([&](const auto&... e) { return std::make_tuple(map_tensors(e, fn)...); }, t);
}
template <typename T, typename Fn,
          typename = std::enable_if_t<!std::is_convertible_v<const T&, const at::Tensor&>>>
T map_tensors(const T& value, Fn&) {
  return value;  // not a tensor: unchanged
}

}  // namespace ddp::intake
