#pragma once
// The flags every tool that wraps a model in DistributedDataParallel shares, derived from the one
// options model (parallel/ddp_options.hpp): ddp-train and ddp-bench register them here, so a flag
// has one name, one meaning and one default everywhere, and adding an option adds its flag once.

#include <CLI/CLI.hpp>

#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/shard/sharded_module.hpp"

namespace ddp::tools {

// --bucket-cap-mb, --first-bucket-cap-mb, --no-bucket-view, --find-unused-parameters,
// --static-graph, --no-graph-planning, --stats-every; each writes into `options`, whose current
// values are the shown defaults.
void add_ddp_flags(CLI::App& app, parallel::DDPOptions& options);

// The comm hooks a tool can name: allreduce (the built-in average), fp16, bf16, powersgd, noop.
const std::vector<std::string>& comm_hook_names();
// --comm-hook NAME (default allreduce).
void add_comm_hook_flag(CLI::App& app, std::string& name);
// The hook for `name` over `pg`; null for "allreduce" (the built-in average). Unknown names are an
// error that lists the known ones.
hooks::CommHookPtr make_comm_hook(const std::string& name, comm::ProcessGroupPtr pg);

// The zoo's model flags, shared by ddp-bench and ddp-train: --tie-weights (GPT-2's tied wte /
// lm_head weight, WorkloadOptions::tie_weights) and --sync-bn (resnet-small's SyncBatchNorm,
// WorkloadOptions::sync_batch_norm); each writes into `options`.
void add_model_flags(CLI::App& app, models::WorkloadOptions& options);
// After parsing: the complaint about a model flag that --model `model` cannot take ("" when it
// can), so that it is refused before any worker starts.
// `tp`: the run's --tp (dropout under tensor parallelism is refused: the ranks of a tp group would
// draw different masks for the activations they share).
std::string check_model_flags(const std::string& model, const models::WorkloadOptions& options,
                              int64_t tp = 0);

// The data-parallel style's flags (docs/sharding.md), one way in both tools: --style, or its
// short forms --ddp (replicate) and --fsdp (fully_shard); two that disagree are refused.
struct ShardFlags {
  // --style as given ("" when not); after check_shard_flags the style chosen by any of the three,
  // replicate (DistributedDataParallel) when none was given.
  std::string style;
  bool ddp = false;   // --ddp: the same as --style replicate (the seed's flag)
  bool fsdp = false;  // --fsdp: the same as --style fully_shard (the seed's flag)
  // After check_shard_flags: a style was asked for (ddp-bench runs the bare model otherwise).
  bool chosen = false;
  bool fsdp_wrap = false;       // --fsdp-wrap: a unit per block / layer (Workload::wrap_units)
  shard::ShardOptions options;  // --reshard-after-forward, --prefetch write here
  bool checkpoint =
      false;  // --fsdp-checkpoint: recompute every wrap unit's activations (any style)
  std::string param_dtype;   // --param-dtype fp32|bf16|fp16 ("": the parameters' dtype)
  std::string reduce_dtype;  // --reduce-dtype fp32|bf16|fp16 ("": param_dtype's, else theirs)
  // --dp-replicate R|nodes: hybrid sharding, R replicas of world / R / --tp shards each; "nodes":
  // R is the launcher's node count (comm::node_count). "": flat (so is 1).
  std::string dp_replicate;
  // --local-init: each rank draws only its shards' initial values, on its device
  // (shard::InitDraws::kLocal, FSDP2's meta-device path); default the single process's numbers.
  bool local_init = false;
  bool sharded() const { return !style.empty() && style != "replicate"; }
};
// --fsdp, --style, --fsdp-wrap, --reshard-after-forward, --prefetch, --fsdp-checkpoint,
// --param-dtype, --reduce-dtype, --dp-replicate, --local-init.
void add_shard_flags(CLI::App& app, ShardFlags& flags);
// After parsing: resolves the style (--style, --ddp, --fsdp), applies it and the dtypes to
// flags.options, and returns the complaint about flags that do not go together ("" when they
// do). `ddp_only`: the tool's DistributedDataParallel-only flags that were given (e.g.
// "--comm-hook powersgd"), refused with a sharded style.
std::string check_shard_flags(ShardFlags& flags, const std::vector<std::string>& ddp_only);

}  // namespace ddp::tools
