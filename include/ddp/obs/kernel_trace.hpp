#pragma once
// KernelTrace: a kernel-level trace of a few steps, from C++, through torch's Kineto profiler (the
// one torch.profiler drives): every CUDA kernel, copy and memset with its stream and GPU start and
// end (CUPTI), the CUDA calls that launched them, and on request the host's ops. Written as Chrome
// trace JSON (chrome://tracing, Perfetto, bench/trace_attribution.py).
//
// Unlike ChromeTrace (obs/chrome_trace.hpp), which ddp-bench --profile fills from host timers with
// a device synchronization between phases, this changes nothing in the step it watches: the GPU
// runs ahead of the host as in an untraced step, and a bucket's all-reduce shows where it really
// ran against backward's kernels, on NCCL's stream. The cost is the profiler's own (a few us per
// launch on the host), so time steps without it.
//
// States: tracing (from construction) -> saved (save()); a second save() is refused by name.

#include <string>

namespace ddp::obs {

struct KernelTraceOptions {
  // Also trace the host's ops. Default false: the profiler's cost per
  // op on the host (tens of us) starves a launch-bound step of its GPU (measured on 2x H200: a
  // gpt2-medium DDP step spread over 125 ms of GPU time traced with host ops, 61 ms untraced), so
  // a kernel trace alone keeps the device's timeline as it is. The CUDA API calls (each kernel's
  // launch) are traced either way.
  bool host_ops = false;
};

class KernelTrace {
 public:
  // Starts tracing the device's kernels, copies and memsets (and the host's ops with
  // options.host_ops). Throws naming the cause without a CUDA libtorch (Debian's 1.13 is CPU
  // only and has no Kineto).
  explicit KernelTrace(KernelTraceOptions options = {});
  // Stops a trace that was never saved, discarding it.
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Stops tracing and writes the Chrome trace JSON to `path`. Once.
  void save(const std::string& path);

  // Whether this libtorch can trace: a CUDA build (the wheels carry Kineto).
  static bool available();

 private:
  bool tracing_ = false;  // true from construction until save() or destruction stops it
};

}  // namespace ddp::obs
