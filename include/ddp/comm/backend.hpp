#pragma once
// Backend: which c10d process group runs the collectives, and what it can do. Behaviour is chosen
// by these traits, never by comparing backend names: a new backend is one enum value and one
// traits row, and the compiler finds every switch that must learn it.

#include <c10/core/DeviceType.h>

#include <string>
#include <string_view>

namespace ddp::comm {

enum class Backend {
  kGloo,  // CPU tensors; every build with Gloo headers (Debian's libtorch 1.13)
  kNccl,  // CUDA tensors; CUDA builds (the GPU machine's torch 2.x)
};

// What a backend does natively. One row per backend, known at compile time.
struct BackendTraits {
  const char* name;  // "gloo", "nccl": for logs, errors and the tools' --backend flag
  // The average is computed inside the reduction (ncclAvg pre-multiplies every input by
  // 1/world size): no separate division pass, no overflow of low-precision sums. Otherwise the
  // caller divides first, then sums.
  bool reduces_avg;
  // Sums bfloat16 tensors (Gloo in libtorch 1.13 has no bfloat16 sum).
  bool sums_bf16;
  // Has reduce-scatter and all-gather from/into one flat tensor (c10d `_reduce_scatter_base`,
  // `_allgather_base`). Gloo 1.13 refuses both: ProcessGroup emulates them (see the costs in
  // [Note: flat collectives] in process_group.hpp).
  bool flat_collectives;
  // Waiting on a collective is a stream dependency (the caller's CUDA stream waits on its end
  // event, the host goes on) rather than a bounded host wait.
  bool waits_on_stream;
  // Where its tensors live: control scalars (counts, flags) are made there.
  c10::DeviceType device_type;
};

constexpr BackendTraits traits(Backend backend) {
  switch (backend) {
    case Backend::kNccl:
      return {"nccl",
              /*reduces_avg=*/true,
              /*sums_bf16=*/true,
              /*flat_collectives=*/true,
              /*waits_on_stream=*/true,
              c10::DeviceType::CUDA};
    case Backend::kGloo:
      break;
  }
  return {"gloo",
          /*reduces_avg=*/false,
          /*sums_bf16=*/false,
          /*flat_collectives=*/false,
          /*waits_on_stream=*/false,
          c10::DeviceType::CPU};
}

// "gloo" / "nccl".
constexpr const char* backend_name(Backend backend) { return traits(backend).name; }

// Parses "gloo" or "nccl"; anything else is an error that names the text and the choices:
// "ddp: unknown backend 'mpi': expected 'gloo' or 'nccl'".
Backend parse_backend(std::string_view text);

}  // namespace ddp::comm
