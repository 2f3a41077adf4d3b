#include "comm_floor.hpp"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/recorder/flight_ring.hpp"

namespace ddp::tools {
namespace {

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// One buffer per (kind, size, dtype): a replay reuses it, as the step reuses its flat buffers;
// the values do not matter (zeros, so no reduction meets a NaN).
class Buffers {
 public:
  explicit Buffers(const c10::Device& device) : device_(device) {}
  at::Tensor& get(int role, int64_t numel, c10::ScalarType dtype) {
    auto [it, made] = buffers_.try_emplace({role, numel, dtype});
    if (made) it->second = at::zeros({numel}, at::TensorOptions().device(device_).dtype(dtype));
    return it->second;
  }

 private:
  c10::Device device_;
  std::map<std::tuple<int, int64_t, c10::ScalarType>, at::Tensor> buffers_;
};

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

CommFloor comm_floor(comm::ProcessGroup& group, int64_t first, int64_t last, int repeats) {
  std::vector<comm::FlightEntry> step;
  for (const auto& entry : group.flight_snapshot().entries) {
    if (entry.seq >= first && entry.seq <= last) step.push_back(entry);
  }
  TORCH_CHECK(static_cast<int64_t>(step.size()) == last - first + 1,
              "ddp-bench --comm-floor: the flight ring kept ", step.size(), " of collectives #",
              first, "-#", last, " (the recorder off, or DDP_FLIGHT_RECORDER_SIZE too small)");
  const c10::Device device = group.device();
  const int world = group.world_size();
  Buffers buffers(device);
  CommFloor floor;
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    floor.collectives = floor.skipped = 0;
    floor.bytes = 0;
    std::vector<comm::PendingCollective> pending;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& entry : step) {
      const char* kind = entry.op.kind;
      const int64_t n = entry.op.numel;
      const c10::ScalarType dtype = entry.op.dtype;
      if (starts_with(kind, "all-gather (flat)")) {
        const int64_t own = comm::FlatShards{n, world}.length(group.rank());
        pending.push_back(
            group.all_gather_async(buffers.get(0, own, dtype), buffers.get(1, n, dtype)));
      } else if (starts_with(kind, "reduce-scatter")) {
        const bool sum = std::strstr(kind, "(sum)") != nullptr;
        pending.push_back(group.reduce_scatter_async(
            buffers.get(2, n, dtype), sum ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg,
            /*reuse_input=*/true));
      } else if (starts_with(kind, "all-reduce")) {
        at::Tensor& t = buffers.get(3, n, dtype);
        works.push_back(std::strstr(kind, "(sum)") ? group.allreduce_sum_async(t)
                                                   : group.allreduce_avg_async(t));
      } else {
        ++floor.skipped;
        continue;
      }
      ++floor.collectives;
      floor.bytes += n * static_cast<int64_t>(c10::elementSize(dtype));
    }
    for (auto& p : pending) p.wait_on_stream("the comm floor's replayed collective");
    for (auto& w : works) group.wait_on_stream(w, "the comm floor's replayed all-reduce");
    synchronize(device);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  floor.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  return floor;
}

}  // namespace ddp::tools
