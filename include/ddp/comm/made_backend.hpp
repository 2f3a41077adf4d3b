#pragma once
// MadeBackend: the c10d backend of one group and how to shut it down, as a BackendFactory
// (comm/process_group.hpp) makes it. Internal: its type differs between libtorch versions
// (detail/torch_compat.hpp), which the public headers do not include.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <functional>

#include "ddp/comm/process_group.hpp"
#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

struct MadeBackend {
  c10::intrusive_ptr<detail::CollectiveBackend> backend;
  std::function<void()> shutdown;  // may be empty; runs when the group is destroyed
  // Memory the communicator has registered (NcclOptions::register_buffers): what
  // ProcessGroup::empty_registered returns; empty: plain at::empty.
  std::function<at::Tensor(int64_t numel, const at::TensorOptions& options)> empty_registered;
};

}  // namespace ddp::comm
