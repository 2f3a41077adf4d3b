#include "ddp/comm/backend.hpp"

#include <c10/util/Exception.h>

namespace ddp::comm {

Backend parse_backend(std::string_view text) {
  // The one place a backend name is compared: everything after this works on the enum.
  for (Backend b : {Backend::kGloo, Backend::kNccl}) {
    if (text == backend_name(b)) return b;
  }
  TORCH_CHECK(false, "ddp: unknown backend '", std::string(text), "': expected '",
              backend_name(Backend::kGloo), "' or '", backend_name(Backend::kNccl), "'");
}

}  // namespace ddp::comm
