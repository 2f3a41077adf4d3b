#pragma once
// UnusedParams: which parameters take part in a synchronized backward, on this rank and on any.
// A parameter no forward output depends on gets no gradient; with find_unused_parameters it
// counts as ready with a zero contribution, and the used-parameter map (int32 per parameter,
// 1 = had a gradient here since the last synchronized backward, no_sync steps included) is summed
// over the ranks so that a parameter used on NO rank keeps the gradient it had, as PyTorch does.
// static_graph records iteration 1's answer and skips the walk and the collective afterwards.
//
// The map lives on the CPU, written by index from the gradient hooks; on CUDA it is pinned and
// copied asynchronously to a device tensor that the all-reduce runs on (NCCL needs device memory).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::gradients {

class UnusedParams {
 public:
  UnusedParams() = default;
  // `device_like`: a parameter's tensor options (its device decides where the map is reduced).
  UnusedParams(size_t num_params, const at::TensorOptions& device_like, bool on_device);

  // After a forward: reachable[p] says whether the outputs depend on parameter p (all true
  // without a graph walk).
  void set_reachable(std::vector<bool> reachable) { reachable_ = std::move(reachable); }
  bool reachable(size_t p) const { return reachable_[p]; }

  // A gradient of p was accumulated (synchronized or no_sync backward).
  void mark_local_use(size_t p) { local_.data_ptr<int>()[p] = 1; }

  // First gradient of a synchronized backward. Returns the parameters that count as ready with no
  // gradient this iteration. With `map` (find_unused_parameters, or static_graph's first
  // iteration) it launches the map's all-reduce, before any bucket on every rank; with a
  // `recorded` static graph it reuses iteration 1's answer.
  std::vector<bool> find_unused(bool map, bool recorded, comm::ProcessGroup& pg);
  // Whether p had a gradient on some rank this iteration; waits (bounded) for the map first.
  bool globally_used(size_t p, comm::ProcessGroup& pg) {
    wait(pg);
    return globally_used_[p];
  }
  // Whether the map's all-reduce is done (or was not needed): finishing early is possible.
  bool map_ready() const;
  void wait(comm::ProcessGroup& pg);

  // static_graph: remembers iteration 1's unused set and global use.
  void record_static();
  bool static_unused(size_t p) const { return !static_unused_.empty() && static_unused_[p]; }

  // End of a synchronized backward (or an error): forget this iteration.
  void reset();
  // Join: the map's all-reduce of a synchronized backward, with nothing used.
  void shadow(bool map, comm::ProcessGroup& pg);

 private:
  bool on_device_ = false;
  std::vector<bool> reachable_;  // from this forward's outputs; all true without the walk
  // Per parameter: had a gradient since the last synchronized backward. int32 on the CPU (pinned
  // when on_device_); written by index from hooks.
  at::Tensor local_;
  // What the all-reduce runs on: local_ itself, or (on_device_) a device tensor made once.
  at::Tensor wire_;
  c10::intrusive_ptr<c10d::Work> work_;  // in flight; null when not needed or done
  std::vector<bool> globally_used_;      // valid when map_ready(); all true without the map
  bool ready_ = true;
  std::vector<bool> static_unused_;         // static_graph: unused in iteration 1
  std::vector<bool> static_globally_used_;  // static_graph: iteration 1's global answer
};

}  // namespace ddp::gradients
