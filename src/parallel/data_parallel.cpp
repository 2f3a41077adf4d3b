#include "ddp/parallel/data_parallel.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ddp::parallel {

comm::ProcessGroupPtr data_parallel_group(const comm::DeviceMesh& mesh) {
  const auto& names = mesh.dim_names();
  if (std::find(names.begin(), names.end(), "dp") != names.end()) return mesh.group("dp");
  if (mesh.ndim() == 1) return mesh.group(names[0]);
  std::string dims;
  for (const auto& n : names) dims += (dims.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "ddp: data_parallel over a ", mesh.ndim(),
              "-D mesh needs a mesh dim named 'dp'; this mesh's dims are ", dims);
}

}  // namespace ddp::parallel
