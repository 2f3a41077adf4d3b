#pragma once
// LoaderSampler: one DistributedSampler shared between the training loop and a torch::data
// DataLoader, so that epochs advance and a resumed position survives the loader.
//
// Why a second class: torch::data::make_data_loader takes its sampler by value and keeps it
// private, and every DataLoader::begin() calls sampler.reset(). With a DistributedSampler passed
// directly, the loop can no longer call set_epoch (every pass replays epoch 0, the same order),
// and a seek() before the first pass is undone by that reset (a resumed run replays its epoch).
// LoaderSampler holds a shared_ptr to the loop's sampler and gives reset() the meaning a loader
// needs: "start the next pass".
//
//   auto sampler = std::make_shared<ddp::data::DistributedSampler>(options);
//   sampler->seek_data_position(data_position);              // when resuming (docs/data.md)
//   auto loader = torch::data::make_data_loader(dataset, ddp::data::LoaderSampler(sampler),
//                                               torch::data::DataLoaderOptions(batch_size));
//   for (int64_t e = sampler->epoch(); e < epochs; ++e)
//     for (auto& batch : *loader) { ... }                  // one pass = the rest of epoch e
//
// The loader calls the sampler only from the thread that iterates it (its worker threads only
// call the dataset), so no lock is needed; read sampler->consumed() from that thread too.

#include <torch/data/samplers/base.h>

#include <c10/util/Optional.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "ddp/data/distributed_sampler.hpp"

namespace ddp::data {

class LoaderSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // `sampler` must not be null; the loop keeps its own copy of the pointer.
  explicit LoaderSampler(std::shared_ptr<DistributedSampler> sampler);

  const std::shared_ptr<DistributedSampler>& sampler() const { return sampler_; }

  // Forwards to DistributedSampler::next.
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  // What DataLoader::begin() calls. Without new_size: if the sampler's epoch is exhausted, starts
  // the next epoch; otherwise leaves the position as it is (a fresh epoch, a seek, or a pass the
  // loop left early). With new_size: DistributedSampler::reset(new_size), back to the epoch's
  // start.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  // Forward to the shared sampler.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::shared_ptr<DistributedSampler> sampler_;  // never null; shared with the training loop
};

}  // namespace ddp::data
