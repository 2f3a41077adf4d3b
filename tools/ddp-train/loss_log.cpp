#include "loss_log.hpp"

#include <c10/util/Exception.h>

namespace ddp::tools {

LossLog::LossLog(comm::ProcessGroupPtr group, torch::Device device, int capacity)
    : group_(std::move(group)),
      capacity_(capacity),
      slots_(
          torch::zeros({capacity}, torch::TensorOptions().dtype(torch::kDouble).device(device))) {
  TORCH_CHECK(capacity > 0, "LossLog: capacity must be positive, got ", capacity);
}

void LossLog::record(int step, const torch::Tensor& loss) {
  TORCH_CHECK(!full(), "LossLog: ", capacity_, " steps recorded without a flush");
  slots_.select(0, static_cast<int64_t>(steps_.size())).copy_(loss.detach().reshape({}));
  steps_.push_back(step);
}

std::vector<std::pair<int, double>> LossLog::flush() {
  std::vector<std::pair<int, double>> out;
  if (steps_.empty()) return out;
  torch::Tensor sums = slots_.narrow(0, 0, static_cast<int64_t>(steps_.size())).clone();
  group_->allreduce_sum(sums, "loss all-reduce");
  sums = sums.cpu();
  const double world = group_->world_size();
  const double* values = sums.data_ptr<double>();
  for (size_t i = 0; i < steps_.size(); ++i) out.emplace_back(steps_[i], values[i] / world);
  steps_.clear();
  return out;
}

}  // namespace ddp::tools
