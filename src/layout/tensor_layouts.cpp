#include "ddp/layout/tensor_layouts.hpp"

#include <utility>

namespace ddp::layout {

Layout TensorLayouts::of(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto it = by_name.find(name);
  if (it != by_name.end()) return it->second;
  return Layout{shape, mesh, {}};
}

TensorLayouts nest(const TensorLayouts& inner, const TensorLayouts& outer) {
  TensorLayouts out;
  out.mesh = outer.mesh;
  out.mesh.insert(out.mesh.end(), inner.mesh.begin(), inner.mesh.end());
  out.coordinate = outer.coordinate;
  out.coordinate.insert(out.coordinate.end(), inner.coordinate.begin(), inner.coordinate.end());
  for (const auto& [name, in] : inner.by_name) {
    const auto it = outer.by_name.find(name);
    const Layout on_top =
        it != outer.by_name.end() ? it->second : Layout{padded_local_shape(in), outer.mesh, {}};
    out.by_name[name] = nest(in, on_top);
  }
  for (const auto& [name, on_top] : outer.by_name) {
    if (out.by_name.count(name) != 0) continue;
    out.by_name[name] = nest(Layout{on_top.shape, inner.mesh, {}}, on_top);
  }
  return out;
}

TensorLayouts replicated_over(std::vector<int64_t> mesh, std::vector<int64_t> coordinate) {
  TensorLayouts out;
  out.mesh = std::move(mesh);
  out.coordinate = std::move(coordinate);
  return out;
}

}  // namespace ddp::layout
