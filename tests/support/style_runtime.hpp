#pragma once
// The runtime behind a wrapper, for the tests of what only one style has (DDP's join and bucket
// storage; the sharded styles' plan, per-parameter layouts and unit order). The public line hands
// out every style as wrap::WrappedModel; this is the one place a test asks which runtime it is.

#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::testing {

// Null under another style.
inline shard::ShardedModule* sharded_runtime(wrap::WrappedModel& model) {
  return dynamic_cast<shard::ShardedModule*>(&model);
}
inline parallel::DistributedDataParallelBase* replicated_runtime(wrap::WrappedModel& model) {
  return dynamic_cast<parallel::DistributedDataParallelBase*>(&model);
}

}  // namespace ddp::testing
