#include "ddp/data/distributed_sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randperm.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

namespace ddp::data {
namespace {

// Samples per rank for valid options; TORCH_CHECKs them first. `where` prefixes the messages
// ("DistributedSampler", "DistributedSampler::reset").
int64_t checked_samples_per_rank(const SamplerOptions& o, const char* where) {
  TORCH_CHECK(o.size > 0, where, ": size must be > 0 (the number of samples in the dataset), got ",
              o.size);
  TORCH_CHECK(o.world_size >= 1, where, ": world_size must be >= 1, got ", o.world_size);
  TORCH_CHECK(o.rank >= 0 && o.rank < o.world_size, where,
              ": rank must be in [0, world_size), got rank ", o.rank, " with world_size ",
              o.world_size);
  const int64_t world = o.world_size;
  // Python's DistributedSampler silently gives 0 samples here; an epoch with no batch on any
  // rank makes a training loop spin through epochs without a step, so it is an error.
  TORCH_CHECK(!o.drop_last || o.size >= world, where, ": drop_last with size ", o.size,
              " < world_size ", world,
              " would give every rank 0 samples per epoch; use drop_last = false (pad) or fewer "
              "ranks");
  return o.drop_last ? o.size / world : (o.size + world - 1) / world;
}

// The epoch's order before padding and sharding: a permutation of 0..size-1, or the identity.
std::vector<int64_t> epoch_order(const SamplerOptions& o, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(o.size));
  if (!o.shuffle) {
    std::iota(order.begin(), order.end(), int64_t{0});
    return order;
  }
  // seed + epoch as PyTorch's DistributedSampler (g.manual_seed(seed + epoch); randperm(n, g)):
  // the same generator (mt19937) and the same randperm, so the same order, in 1.13 and 2.x.
  // unsigned arithmetic: wraps instead of overflowing for seeds near 2^64.
  at::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(o.seed + static_cast<uint64_t>(epoch));
  const at::Tensor perm = at::randperm(o.size, gen, at::kLong);
  const int64_t* p = perm.data_ptr<int64_t>();
  std::copy(p, p + o.size, order.begin());
  return order;
}

// The archive keys: prefixed so that a sampler can share an archive with other state.
constexpr const char* kFormatKey = "ddp_sampler_format";
constexpr int64_t kFormatVersion = 1;

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value) && value.isInt(),
              "DistributedSampler::load: the archive has no integer '", key,
              "' (it was not written by DistributedSampler::save)");
  return value.toInt();
}

}  // namespace

DistributedSampler::DistributedSampler(SamplerOptions options)
    : options_(options),
      samples_per_rank_(checked_samples_per_rank(options_, "DistributedSampler")) {
  shard_ = epoch_indices(0);
}

int64_t DistributedSampler::real_samples() const {
  if (options_.drop_last) return samples_per_rank_;
  const int64_t w = options_.world_size, r = options_.rank;
  const int64_t real = options_.size > r ? (options_.size - r + w - 1) / w : 0;
  return std::min(real, samples_per_rank_);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  TORCH_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch must be >= 0, got ", epoch);
  // consumed() = epoch * samples_per_rank must stay representable.
  TORCH_CHECK(epoch <= std::numeric_limits<int64_t>::max() / samples_per_rank_ - 1,
              "DistributedSampler::set_epoch: epoch ", epoch, " is too large for ",
              samples_per_rank_, " samples per rank");
  if (epoch != epoch_ || shard_.empty()) shard_ = epoch_indices(epoch);
  epoch_ = epoch;
  index_ = 0;
}

void DistributedSampler::seek(int64_t consumed) {
  TORCH_CHECK(consumed >= 0, "DistributedSampler::seek: consumed must be >= 0, got ", consumed);
  set_epoch(consumed / samples_per_rank_);
  index_ = consumed % samples_per_rank_;
}

int64_t DistributedSampler::group_epoch_end() const {
  return std::min(options_.size, samples_per_rank_ * options_.world_size);
}

int64_t DistributedSampler::data_position() const { return data_position_at(consumed()); }

int64_t DistributedSampler::data_position_at(int64_t consumed) const {
  TORCH_CHECK(consumed >= 0, "DistributedSampler::data_position_at: consumed must be >= 0, got ",
              consumed);
  const int64_t epoch = consumed / samples_per_rank_, index = consumed % samples_per_rank_;
  const int64_t taken = index * options_.world_size;
  return taken >= group_epoch_end() ? (epoch + 1) * options_.size : epoch * options_.size + taken;
}

void DistributedSampler::seek_data_position(int64_t position) {
  TORCH_CHECK(position >= 0, "DistributedSampler::seek_data_position: position must be >= 0, got ",
              position);
  const int64_t epoch = position / options_.size, taken = position % options_.size;
  if (taken >= group_epoch_end()) {  // drop_last at this world size: the epoch's tail is dropped
    set_epoch(epoch + 1);
    return;
  }
  TORCH_CHECK(taken % options_.world_size == 0, "DistributedSampler::seek_data_position: position ",
              position, " is sample ", taken, " of epoch ", epoch, ", which does not divide over ",
              options_.world_size,
              " ranks; resume with a global batch that divides it (the saved run's)");
  set_epoch(epoch);
  index_ = taken / options_.world_size;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  // An empty batch is not a batch: torch's DataLoader asserts that a request is non-empty.
  TORCH_CHECK(batch_size > 0, "DistributedSampler::next: batch_size must be > 0, got 0");
  if (index_ >= samples_per_rank_) return c10::nullopt;
  const int64_t end =
      std::min(samples_per_rank_, index_ + static_cast<int64_t>(std::min<size_t>(
                                               batch_size, std::numeric_limits<int64_t>::max())));
  std::vector<size_t> batch(shard_.begin() + index_, shard_.begin() + end);
  index_ = end;
  return batch;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  if (new_size.has_value()) {
    SamplerOptions resized = options_;
    TORCH_CHECK(*new_size <= static_cast<size_t>(std::numeric_limits<int64_t>::max()),
                "DistributedSampler::reset: size ", *new_size, " does not fit in int64");
    resized.size = static_cast<int64_t>(*new_size);
    samples_per_rank_ = checked_samples_per_rank(resized, "DistributedSampler::reset");
    options_ = resized;
    shard_.clear();  // another size is another order: recompute
  }
  set_epoch(epoch_);
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write(kFormatKey, c10::IValue(kFormatVersion));
  archive.write("ddp_sampler_size", c10::IValue(options_.size));
  archive.write("ddp_sampler_world_size", c10::IValue(int64_t{options_.world_size}));
  archive.write("ddp_sampler_rank", c10::IValue(int64_t{options_.rank}));
  archive.write("ddp_sampler_shuffle", c10::IValue(int64_t{options_.shuffle}));
  // The bit pattern: IValue holds no unsigned integers.
  archive.write("ddp_sampler_seed", c10::IValue(static_cast<int64_t>(options_.seed)));
  archive.write("ddp_sampler_drop_last", c10::IValue(int64_t{options_.drop_last}));
  archive.write("ddp_sampler_epoch", c10::IValue(epoch_));
  archive.write("ddp_sampler_index", c10::IValue(index_));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  const int64_t format = read_int(archive, kFormatKey);
  TORCH_CHECK(format == kFormatVersion, "DistributedSampler::load: the archive has format ", format,
              ", this build reads format ", kFormatVersion);
  // A position means something only in the order it was taken from: refuse another order rather
  // than resume into samples the run never saw (or see some twice).
  const auto same = [&](const char* field, const std::string& key, int64_t ours) {
    const int64_t saved = read_int(archive, key);
    TORCH_CHECK(saved == ours, "DistributedSampler::load: the archive was saved with ", field, " ",
                saved, ", this sampler has ", field, " ", ours,
                "; a position resumes only the same order (same size, world_size, shuffle, seed "
                "and drop_last)");
  };
  same("size", "ddp_sampler_size", options_.size);
  same("world_size", "ddp_sampler_world_size", options_.world_size);
  same("shuffle", "ddp_sampler_shuffle", options_.shuffle);
  same("seed", "ddp_sampler_seed", static_cast<int64_t>(options_.seed));
  same("drop_last", "ddp_sampler_drop_last", options_.drop_last);
  const int64_t epoch = read_int(archive, "ddp_sampler_epoch");
  const int64_t index = read_int(archive, "ddp_sampler_index");
  TORCH_CHECK(index >= 0 && index <= samples_per_rank_, "DistributedSampler::load: index ", index,
              " is outside [0, ", samples_per_rank_, "]");
  // Restored as saved, not through seek(): a sampler saved at the end of an epoch (index ==
  // samples_per_rank) still answers nullopt next, as the saved one would.
  set_epoch(epoch);
  index_ = index;
}

std::vector<int64_t> DistributedSampler::epoch_indices(int64_t epoch) const {
  TORCH_CHECK(epoch >= 0, "DistributedSampler::epoch_indices: epoch must be >= 0, got ", epoch);
  const std::vector<int64_t> order = epoch_order(options_, epoch);
  const int64_t world = options_.world_size;
  std::vector<int64_t> shard(static_cast<size_t>(samples_per_rank_));
  // Position j of the padded order is order[j % size]: padding repeats the order's first indices
  // (cyclically when size < world); with drop_last, j < world * spr <= size never wraps.
  for (int64_t i = 0; i < samples_per_rank_; ++i) {
    shard[static_cast<size_t>(i)] =
        order[static_cast<size_t>((options_.rank + i * world) % options_.size)];
  }
  return shard;
}

}  // namespace ddp::data
