#pragma once
// ddp::data_parallel(module, group or mesh, style, options): the seed's entry point
// (torch/distributed/_spmd/data_parallel.py's styles) in one call. It picks the runtime for the
// style and returns one wrapper type, so a training loop is written once for every style:
//
//   auto model = ddp::data_parallel(net, group, ddp::DataParallelStyle::kFullyShard);
//   torch::optim::AdamW opt(net->parameters(), ...);   // after wrapping: sees the shards
//   loss(model(x), y).backward(); opt.step(); opt.zero_grad();
//
//   kReplicate   DistributedDataParallel (every rank holds the model; buckets all-reduced)
//   kFullyShard  shard::FullyShardedDataParallel (every parameter sharded on dim 0)
//   kDefault     shard::FullyShardedDataParallel with the DEFAULT plan (dim 0 divisible: sharded,
//                else replicated through the reducer)
// With a DeviceMesh the data-parallel group is the mesh dim named "dp", or the only dim of a 1-D
// mesh.

#include <memory>
#include <string>
#include <utility>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"

namespace ddp::parallel {

using shard::DataParallelStyle;

// The options of every style, composed: the call's style says which part is used.
struct DataParallelOptions {
  // kReplicate's (buckets, hooks, unused parameters, ...; defaults as DistributedDataParallel).
  DDPOptions ddp;
  // kFullyShard's and kDefault's (units, reshard_after_forward, prefetch, the replicated
  // parameters' reducer); its `style` field is set from the call's style.
  shard::ShardOptions shard;
};

// The data-parallel group of `mesh`: dim "dp", or the only dim. Throws naming the mesh's dims.
comm::ProcessGroupPtr data_parallel_group(const comm::DeviceMesh& mesh);

template <typename ModuleType>
class DataParallel {
 public:
  DataParallel(ModuleType module, comm::ProcessGroupPtr group, DataParallelStyle style,
               DataParallelOptions options = {})
      : style_(style) {
    if (style == DataParallelStyle::kReplicate) {
      replicated_ = std::make_unique<DistributedDataParallel<ModuleType>>(
          std::move(module), std::move(group), std::move(options.ddp));
    } else {
      options.shard.style = style;
      sharded_ = std::make_unique<shard::FullyShardedDataParallel<ModuleType>>(
          std::move(module), std::move(group), std::move(options.shard));
    }
  }

  template <typename... Args>
  auto forward(Args&&... args) {
    if (replicated_) return replicated_->forward(std::forward<Args>(args)...);
    return sharded_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // As DistributedDataParallel::no_sync, for every style.
  [[nodiscard]] reducer::NoSyncGuard no_sync() {
    return replicated_ ? replicated_->no_sync() : sharded_->no_sync();
  }

  DataParallelStyle style() const { return style_; }
  // The runtime behind the style (the other is null): for what only one style has (the bucket
  // table, the unit table, memory, full_parameters).
  DistributedDataParallel<ModuleType>* replicated() { return replicated_.get(); }
  shard::FullyShardedDataParallel<ModuleType>* sharded() { return sharded_.get(); }

 private:
  DataParallelStyle style_;
  std::unique_ptr<DistributedDataParallel<ModuleType>> replicated_;
  std::unique_ptr<shard::FullyShardedDataParallel<ModuleType>> sharded_;
};

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, comm::ProcessGroupPtr group,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), std::move(group), style, std::move(options));
}

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, const comm::DeviceMesh& mesh,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), data_parallel_group(mesh), style,
                                  std::move(options));
}

}  // namespace ddp::parallel

namespace ddp {
using parallel::data_parallel;
using parallel::DataParallel;
using parallel::DataParallelOptions;
using shard::DataParallelStyle;
}  // namespace ddp
