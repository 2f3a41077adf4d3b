#pragma once
// DistributedSampler: which dataset indices this rank reads, epoch after epoch, for torch::data
// datasets. A pure function of (options, epoch, position in the epoch): every rank computes its
// shard alone, with no communication, and a run resumes exactly from one number (consumed()).
//
// Epoch e on rank r of world W, for a dataset of n samples (docs/data.md has the full story):
//
//   order    randperm(n) from a torch CPU generator seeded with seed + e (0..n-1 when !shuffle);
//            the same on every rank, since every rank computes it from the same numbers
//   padded   order[j % n] for j in [0, W * samples_per_rank): drop_last = false repeats the first
//            indices of the order (cyclically when n < W), drop_last = true cuts the tail
//   shard r  padded[r], padded[r + W], padded[r + 2W], ...     [Note: interleaved shards]
//
// This is torch.utils.data.DistributedSampler's layout and seeding, index for index: the Python
// sampler with the same (num_replicas, rank, shuffle, seed, drop_last) and set_epoch(e) yields
// the same indices (docs/data.md says how that was checked).
//
// [Note: interleaved shards]
// Rank r takes every W-th position of the epoch's order, starting at r, rather than a contiguous
// block of it. So the k-th batches of all ranks together (batch size B each) are exactly the
// positions [k*B*W, (k+1)*B*W) of the order: a W-rank run sees the same global batches as one
// process with batch B*W over the same order, the equivalence DDP promises, whatever W is. The
// padding (the last W*spr - n positions) then lands as at most one repeat on each of the last
// ranks (when n >= W) instead of all on the last rank, and the tail dropped by drop_last is the
// end of a fresh random order each epoch, not always the same samples.

#include <torch/data/samplers/base.h>

#include <c10/util/Optional.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ddp::data {

struct SamplerOptions {
  // Samples in the dataset (dataset.size()). Required: no default can be right, and 0 samples
  // would give every rank an empty epoch, which a training loop would spin through forever.
  int64_t size = 0;
  // Ranks sharing the dataset: default 1 (one process). Usually the data-parallel group's size
  // (with tensor parallelism, the "dp" mesh dim's size, not the global world size).
  int world_size = 1;
  // This rank, in [0, world_size): default 0. The rank within the same group as world_size.
  int rank = 0;
  // Default true, as PyTorch: epoch e's order is a permutation seeded by (seed, e), the same on
  // every rank; a new order each epoch. false: the order is 0..size-1 every epoch.
  bool shuffle = true;
  // Default 0, as PyTorch. The generator is seeded with seed + epoch (PyTorch's rule, so the
  // orders match the Python sampler's); only its low 32 bits reach torch's mt19937.
  uint64_t seed = 0;
  // Default false, as PyTorch: pad (repeat the first indices of the epoch's order) so that every
  // rank gets ceil(size / world_size) samples, and no sample is ever skipped. true: drop the
  // order's tail, floor(size / world_size) samples each, no sample twice in an epoch; then size
  // must be >= world_size (otherwise every rank would get 0 samples: refused, not silent).
  bool drop_last = false;
};

// The sampler of one rank. Copyable: torch::data::make_data_loader takes a copy (see
// loader_sampler.hpp for sharing one sampler with a DataLoader so that it can be resumed).
//
// State: the epoch and the position in it; together consumed() = epoch * samples_per_rank +
// index. The shard of the current epoch is cached (computed by set_epoch, seek, reset and load).
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // TORCH_CHECKs the options: each message names the bad field and its value.
  explicit DistributedSampler(SamplerOptions options);

  const SamplerOptions& options() const { return options_; }
  // Samples this rank takes per epoch: ceil(size / world_size), or floor with drop_last.
  int64_t samples_per_rank() const { return samples_per_rank_; }
  // Of those, the ones that are not padding: this rank's k-th sample is position rank + k *
  // world_size of the padded order, a repeat once that is past size. They come first in the
  // epoch, so an evaluation counts the first real_samples() (comm/metric_reduction.hpp). All of
  // them with drop_last.
  int64_t real_samples() const;
  int64_t epoch() const { return epoch_; }
  // Starts `epoch` (>= 0) from its beginning.
  void set_epoch(int64_t epoch);

  // Samples this rank has taken since the start of epoch 0: epoch * samples_per_rank + index in
  // the epoch. The same number on every rank (every rank has the same samples_per_rank).
  int64_t consumed() const { return epoch_ * samples_per_rank_ + index_; }
  // Resume: continue exactly where a run that had consumed() == consumed was. A position at the
  // end of an epoch (index == samples_per_rank) resumes at the next epoch's start, which is where
  // that run went next too.
  void seek(int64_t consumed);

  // The group's position in a form any world size can resume (a checkpoint's data_position):
  // epoch * size + the positions of the epoch's order the group has taken (index * world_size),
  // or (epoch + 1) * size once this epoch is done. consumed() * world_size counts padding and
  // per-world epoch lengths, so it means another sample at another world size after the first
  // epoch; this does not. The same number on every rank.
  int64_t data_position() const;
  // The data_position() of this sampler once it has handed out `consumed` samples (consumed()'s
  // unit) since the start of epoch 0: for a loop that counts what it received while a loader with
  // worker threads runs ahead of it (docs/data.md). data_position() ==
  // data_position_at(consumed()).
  int64_t data_position_at(int64_t consumed) const;
  // Continue at data_position() of a run over the same order (size, shuffle, seed, drop_last) at
  // any world size; at the same world size, seek_data_position(data_position()) is the identity.
  // Within an epoch the group's position must divide over world_size (it does when the global
  // batch is kept): otherwise throws naming the position, since rounding would replay or skip
  // samples. A position at or past this world size's epoch end resumes at the next epoch.
  void seek_data_position(int64_t position);

  // libtorch's Sampler interface. The next up to batch_size (> 0) indices of this rank in this
  // epoch; nullopt at the epoch's end (the caller then calls set_epoch(epoch() + 1)). The
  // epoch's last batch is short when batch_size does not divide samples_per_rank.
  // (c10::optional: the base class's type, a distinct type in libtorch 1.13, std::optional since
  // 2.x; see detail/torch_compat.hpp.)
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  // Back to the current epoch's start; with new_size, the dataset has that many samples now.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  // The options that define the order (size, world_size, shuffle, seed, drop_last) and the
  // position (epoch, index). load() refuses an archive whose order options differ from this
  // sampler's, naming the field; the rank may differ (every rank has the same position).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The indices this rank takes in `epoch` (the whole epoch's shard), for tools and tests.
  std::vector<int64_t> epoch_indices(int64_t epoch) const;

 private:
  SamplerOptions options_;
  // Positions of an epoch's order the group takes before the epoch ends: size with padding (the
  // padded tail repeats samples already taken), world_size * samples_per_rank with drop_last.
  int64_t group_epoch_end() const;

  int64_t samples_per_rank_ = 0;  // from options_ (validated, > 0); changes only with reset(n)
  int64_t epoch_ = 0;             // the epoch being read, >= 0
  int64_t index_ = 0;             // samples taken in epoch_, in [0, samples_per_rank_]
  std::vector<int64_t> shard_;    // epoch_indices(epoch_), samples_per_rank_ long
};

}  // namespace ddp::data
