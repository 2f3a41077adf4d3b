#include "ddp/data/loader_sampler.hpp"

#include <c10/util/Exception.h>

#include <utility>

namespace ddp::data {

LoaderSampler::LoaderSampler(std::shared_ptr<DistributedSampler> sampler)
    : sampler_(std::move(sampler)) {
  TORCH_CHECK(sampler_ != nullptr, "LoaderSampler: the DistributedSampler must not be null");
}

c10::optional<std::vector<size_t>> LoaderSampler::next(size_t batch_size) {
  return sampler_->next(batch_size);
}

void LoaderSampler::reset(c10::optional<size_t> new_size) {
  if (new_size.has_value()) {
    sampler_->reset(new_size);
    return;
  }
  const bool exhausted =
      sampler_->consumed() == (sampler_->epoch() + 1) * sampler_->samples_per_rank();
  if (exhausted) sampler_->set_epoch(sampler_->epoch() + 1);
}

void LoaderSampler::save(torch::serialize::OutputArchive& archive) const {
  sampler_->save(archive);
}

void LoaderSampler::load(torch::serialize::InputArchive& archive) { sampler_->load(archive); }

}  // namespace ddp::data
