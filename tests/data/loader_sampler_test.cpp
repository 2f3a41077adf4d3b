// LoaderSampler (data/loader_sampler.hpp): one DistributedSampler shared with a torch::data
// DataLoader, so that its passes advance epochs and a resumed position survives the loader's
// reset(), with and without loader workers.

#include "ddp/data/loader_sampler.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "ddp/data/distributed_sampler.hpp"

namespace ddp::data {
namespace {

constexpr int64_t kLastEpoch = 2;  // epochs 0, 1 and 2: two epoch changes seen by the loader

// A dataset whose example i is the index i itself.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  explicit IndexDataset(int64_t n) : n(n) {}
  torch::data::Example<> get(size_t index) override {
    return {torch::tensor(static_cast<int64_t>(index)), torch::tensor(int64_t{0})};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(n); }
  int64_t n;
};

std::vector<int64_t> concat_epochs(const DistributedSampler& s, int64_t from, int64_t to) {
  std::vector<int64_t> all;
  for (int64_t e = from; e <= to; ++e) {
    const auto shard = s.epoch_indices(e);
    all.insert(all.end(), shard.begin(), shard.end());
  }
  return all;
}

// With LoaderSampler, each pass of a DataLoader is the rest of the sampler's epoch; the next pass
// starts the next epoch, and a seek() before the first pass survives the loader's reset. Without
// loader workers the sampler's consumed() is what the loop received; with workers it runs ahead
// (the loader prefetches), which is why docs/data.md counts received samples instead.
TEST(DistributedSamplerLoader, PassesAdvanceEpochsAndKeepAResumedPosition) {
  SamplerOptions o;  // 11 samples over 3 ranks, this is rank 1: 4 each, batches of 3 and 1
  o.size = 11;
  o.world_size = 3;
  o.rank = 1;
  const size_t kBatch = 3;
  for (size_t workers : {0, 2}) {
    auto sampler = std::make_shared<DistributedSampler>(o);
    auto loader =
        torch::data::make_data_loader(IndexDataset(o.size), LoaderSampler(sampler),
                                      torch::data::DataLoaderOptions(kBatch).workers(workers));
    std::vector<int64_t> seen;
    std::vector<int64_t> positions;  // start of pass + received, after every batch
    for (int64_t e = sampler->epoch(); e <= kLastEpoch; ++e) {
      const int64_t start = sampler->consumed();
      int64_t received = 0;
      for (auto& batch : *loader) {
        for (const auto& example : batch) seen.push_back(example.data.item<int64_t>());
        received += static_cast<int64_t>(batch.size());
        positions.push_back(start + received);
        if (workers == 0) {
          EXPECT_EQ(sampler->consumed(), start + received);
        }
        // 2 workers prefetch 4 batches: the epoch's second batch is requested before the loop
        // has the first one.
        if (workers > 0 && received < sampler->samples_per_rank()) {
          EXPECT_GT(sampler->consumed(), start + received);
        }
      }
    }
    EXPECT_EQ(seen, concat_epochs(*sampler, 0, kLastEpoch)) << workers << " workers";

    // Resume at every batch boundary from the position the loop counted.
    for (size_t k = 0; k < positions.size(); ++k) {
      auto resumed = std::make_shared<DistributedSampler>(o);
      resumed->seek(positions[k]);
      auto again =
          torch::data::make_data_loader(IndexDataset(o.size), LoaderSampler(resumed),
                                        torch::data::DataLoaderOptions(kBatch).workers(workers));
      std::vector<int64_t> rest;
      for (int64_t e = resumed->epoch(); e <= kLastEpoch; ++e) {
        for (auto& batch : *again) {
          for (const auto& example : batch) rest.push_back(example.data.item<int64_t>());
        }
      }
      const std::vector<int64_t> expected(seen.begin() + positions[k], seen.end());
      EXPECT_EQ(rest, expected) << workers << " workers, resumed at " << positions[k];
    }
  }
}

// PyTorch's habit, set_epoch(e) before each pass, gives the same epochs.
TEST(DistributedSamplerLoader, ExplicitSetEpochPerPassWorksToo) {
  SamplerOptions o;  // 10 samples over 2 ranks, drop_last
  o.size = 10;
  o.world_size = 2;
  o.drop_last = true;
  auto sampler = std::make_shared<DistributedSampler>(o);
  auto loader = torch::data::make_data_loader(IndexDataset(o.size), LoaderSampler(sampler),
                                              torch::data::DataLoaderOptions(2));
  std::vector<int64_t> seen;
  for (int64_t e = 0; e <= kLastEpoch; ++e) {
    sampler->set_epoch(e);
    for (auto& batch : *loader) {
      for (const auto& example : batch) seen.push_back(example.data.item<int64_t>());
    }
  }
  EXPECT_EQ(seen, concat_epochs(*sampler, 0, kLastEpoch));
}

}  // namespace
}  // namespace ddp::data
