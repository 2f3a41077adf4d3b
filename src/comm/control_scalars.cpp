#include "ddp/comm/control_scalars.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ddp::comm {

at::Tensor control_tensor(const ProcessGroup& pg, const std::vector<int64_t>& values,
                          at::ScalarType dtype) {
  // Built on the host, then one copy to the group's device (none for Gloo).
  at::Tensor host = at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(dtype);
  return host.to(pg.device());
}

int64_t read_scalar(const at::Tensor& t, int64_t index) {
  TORCH_CHECK(t.defined() && index >= 0 && index < t.numel(), "ddp: read_scalar: index ", index,
              " is outside a tensor of ", t.defined() ? t.numel() : 0, " elements");
  return t.reshape({-1})[index].item<int64_t>();
}

std::vector<int64_t> read_scalars(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "ddp: read_scalars needs a defined tensor");
  const at::Tensor host = t.reshape({-1}).to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = host.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + host.numel());
}

}  // namespace ddp::comm
