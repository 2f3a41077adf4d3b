#include "ddp/obs/kernel_trace.hpp"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>

namespace ddp::obs {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// CUPTI's kernels, copies, memsets and CUDA API calls; with host_ops also the host's ops.
std::set<ActivityType> activities(const KernelTraceOptions& options) {
  if (options.host_ops) return {ActivityType::CPU, ActivityType::CUDA};
  return {ActivityType::CUDA};
}

}  // namespace

bool KernelTrace::available() {
  // CUDA builds of libtorch (the wheels) carry Kineto; Debian's CPU-only 1.13 does not, and its
  // profiler would return a trace without a device timeline: refused rather than half-written.
  return at::hasCUDA();
}

KernelTrace::KernelTrace(KernelTraceOptions options) {
  TORCH_CHECK(available(),
              "ddp: a kernel trace (--kernel-trace) needs a CUDA build of libtorch (with Kineto, "
              "torch's profiler); this one has no CUDA");
  const ProfilerConfig config(ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities(options));
  profiler::enableProfiler(config, activities(options));
  tracing_ = true;
}

KernelTrace::~KernelTrace() {
  if (!tracing_) return;
  try {
    (void)profiler::disableProfiler();
  } catch (...) {
    // A destructor must not throw; the trace is discarded anyway.
  }
}

void KernelTrace::save(const std::string& path) {
  TORCH_CHECK(tracing_, "ddp: this kernel trace was already saved; start a new KernelTrace");
  tracing_ = false;
  auto result = profiler::disableProfiler();
  TORCH_CHECK(result != nullptr, "ddp: the profiler returned no trace to write to '", path, "'");
  result->save(path);
}

}  // namespace ddp::obs
