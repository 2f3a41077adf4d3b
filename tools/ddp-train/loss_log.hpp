#pragma once
// The training loss of each step, kept on the device until it is read: one all-reduce (the mean
// over ranks) and one device-to-host copy per flush instead of per step. Read per step, the loss
// made the host wait for every step's GPU work before launching the next, so the host never ran
// ahead; a captured step (--cuda-graph) is one launch, and the wait was most of its time.

#include <torch/types.h>

#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::tools {

class LossLog {
 public:
  // `capacity` steps may be recorded between flushes (record() refuses more).
  LossLog(comm::ProcessGroupPtr group, torch::Device device, int capacity);
  // Copies `loss` (a scalar on `device`) into the next slot, on the current stream: no sync.
  void record(int step, const torch::Tensor& loss);
  bool full() const { return static_cast<int>(steps_.size()) == capacity_; }
  // Collective (every rank flushes at the same steps): the recorded steps with their losses
  // averaged over the ranks, oldest first; empties the log.
  std::vector<std::pair<int, double>> flush();

 private:
  comm::ProcessGroupPtr group_;
  int capacity_;
  torch::Tensor slots_;     // [capacity] float64 on the device
  std::vector<int> steps_;  // the step of each filled slot; size() <= capacity_
};

}  // namespace ddp::tools
