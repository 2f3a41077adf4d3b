#pragma once
// DataParallelStyle: which data-parallel style a model is wrapped in (public: a user names it in
// ddp::data_parallel(module, group, style)). The styles are torch/distributed/_spmd/
// data_parallel.py's; shard/shard_plan.hpp's [Note: styles] says what each shards. It lives with
// shard/ because the shard plan, below parallel/ in the house, plans by it.

#include <string>

namespace ddp::shard {

enum class DataParallelStyle {
  kReplicate,   // every parameter on every rank, gradients all-reduced (DistributedDataParallel)
  kFullyShard,  // every parameter sharded on dim 0 (FSDP2's fully_shard, ZeRO-3)
  kDefault,     // sharded where dim 0 divides by the group size, replicated elsewhere
};

const char* style_name(DataParallelStyle style);  // "replicate", "fully_shard", "default"
// The inverse, for flags; throws c10::Error naming the text and the choices.
DataParallelStyle parse_style(const std::string& text);

}  // namespace ddp::shard
