#include "host_staging.hpp"

#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/obs/log.hpp"

namespace ddp::io::detail {
namespace {

// The tensor a name reaches, as far as its bytes go: a tied weight is one of these under two
// names (each name's tensor is its own detached view).
using Identity = std::tuple<const void*, std::vector<int64_t>, std::vector<int64_t>, int>;

Identity identity_of(const at::Tensor& t) {
  return {t.data_ptr(), t.sizes().vec(), t.strides().vec(), int(t.scalar_type())};
}

}  // namespace

CheckpointContents HostStaging::stage(const CheckpointContents& live) {
  CheckpointContents staged = live;
  std::map<Identity, at::Tensor> copied;
  for (ContentFile& file : staged.files) {
    for (auto& [name, tensor] : file.tensors) {
      const at::Tensor source = tensor.detach();
      const Identity id = identity_of(source);
      if (const auto seen = copied.find(id); seen != copied.end()) {
        tensor = seen->second;
        continue;
      }
      Buffer& held = buffers_[file.name + "/" + name];
      at::Tensor& buffer = held.tensor;
      if (!buffer.defined() || buffer.sizes() != source.sizes() ||
          buffer.scalar_type() != source.scalar_type()) {
        if (buffer.defined()) bytes_ -= int64_t(buffer.nbytes());
        // Pageable for now: pinned memory is pinned after the writes (pin_for_next_save).
        buffer = at::empty(source.sizes(), source.options().device(at::kCPU));
        held.wants_pinned = source.is_cuda();
        bytes_ += int64_t(buffer.nbytes());
      }
      // Blocking: when this returns the bytes are in host memory, whatever the source's stream
      // does next.
      buffer.copy_(source, /*non_blocking=*/false);
      tensor = buffer;
      copied.emplace(id, buffer);
    }
  }
  return staged;
}

void HostStaging::pin_for_next_save() {
  for (auto& [key, held] : buffers_) {
    if (!held.wants_pinned || held.tensor.is_pinned()) continue;
    try {
      // Pinned needs the CUDA runtime: only GPU sources get here.
      held.tensor = at::empty(held.tensor.sizes(), held.tensor.options().pinned_memory(true));
    } catch (const c10::Error& e) {
      // Out of pinned memory: the pageable buffers serve, slower to fill.
      obs::log(obs::LogLevel::kWarn, 0,
               std::string("ddp: warning: checkpoint staging stays in pageable host memory: ") +
                   e.what_without_backtrace());
      for (auto& [other, rest] : buffers_) rest.wants_pinned = false;
      return;
    }
  }
}

}  // namespace ddp::io::detail
