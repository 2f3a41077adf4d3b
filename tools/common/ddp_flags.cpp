#include "ddp_flags.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

#include "common/flag_parse.hpp"
#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/hooks/default_hooks.hpp"
#include "ddp/hooks/powersgd_hook.hpp"

namespace ddp::tools {

namespace {
std::string mib_text(size_t bytes) {
  std::ostringstream out;
  out << static_cast<double>(bytes) / static_cast<double>(buckets::kMiB);
  return out.str();
}
}  // namespace

void add_ddp_flags(CLI::App& app, parallel::DDPOptions& options) {
  const FlagGroup group(app, "DistributedDataParallel (--style replicate)");
  auto& caps = options.gradients.buckets;
  app.add_option_function<double>(
         "--bucket-cap-mb", [&caps](double mb) { caps.bucket_cap_bytes = buckets::mib_bytes(mb); },
         "bucket cap (MiB)")
      ->check(CLI::PositiveNumber)
      ->default_str(mib_text(caps.bucket_cap_bytes));
  app.add_option_function<double>(
         "--first-bucket-cap-mb",
         [&caps](double mb) { caps.first_bucket_cap_bytes = buckets::mib_bytes(mb); },
         "first bucket cap (MiB)")
      ->check(CLI::PositiveNumber)
      ->default_str(mib_text(caps.first_bucket_cap_bytes));
  app.add_flag_callback(
      "--no-bucket-view", [&options] { options.gradients.gradient_as_bucket_view = false; },
      "copy gradients instead of bucket views");
  app.add_flag_callback(
      "--find-unused-parameters", [&options] { options.gradients.find_unused_parameters = true; },
      "allow parameters without gradients");
  app.add_flag_callback(
      "--static-graph", [&options] { options.gradients.static_graph = true; },
      "the set of used parameters never changes");
  app.add_flag_callback(
      "--reduce-in-place", [&options] { options.gradients.reduce_in_place = true; },
      "reduce gradients that arrive in tensors of their own where they are (one grouped "
      "all-reduce per bucket) instead of copying them into the bucket first (default on NCCL)");
  app.add_flag_callback(
      "--no-reduce-in-place", [&options] { options.gradients.reduce_in_place = false; },
      "copy every gradient into its bucket before reducing it (the default on Gloo)");
  app.add_flag_callback(
      "--no-overlap", [&options] { options.gradients.overlap = false; },
      "launch every bucket after backward (attribution: what overlap hides)");
  app.add_option("--check-replicas-every", options.check_replicas_every,
                 "every K-th synchronized forward compares a checksum of every parameter (and "
                 "buffer) with rank 0's, naming the first that differs (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag_callback(
      "--no-graph-planning", [&options] { options.graph_planning = false; },
      "bucket in reverse order, rebuild after iteration 1 (PyTorch eager's way; the seed's "
      "--dynamo-no-optimize-ddp)");
  app.add_option("--stats-every", options.stats_every, "sample runtime stats every N iterations")
      ->check(CLI::PositiveNumber)
      ->type_name("N")
      ->capture_default_str();
}

const std::vector<std::string>& comm_hook_names() {
  static const std::vector<std::string> names = {"allreduce", "fp16", "bf16", "powersgd", "noop"};
  return names;
}

void add_comm_hook_flag(CLI::App& app, std::string& name) {
  const FlagGroup group(app, "DistributedDataParallel (--style replicate)");
  app.add_option("--comm-hook", name,
                 "allreduce, fp16, bf16, powersgd or noop (no communication: attribution only)")
      ->check(CLI::IsMember(comm_hook_names()))
      ->capture_default_str();
}

hooks::CommHookPtr make_comm_hook(const std::string& name, comm::ProcessGroupPtr pg) {
  if (name == "allreduce") return nullptr;
  if (name == "fp16") return hooks::fp16_compress_hook(std::move(pg));
  if (name == "bf16") return hooks::bf16_compress_hook(std::move(pg));
  if (name == "powersgd") return hooks::powersgd_hook(std::move(pg));
  if (name == "noop") return hooks::noop_hook();
  TORCH_CHECK(false, "unknown comm hook '", name,
              "': expected allreduce, fp16, bf16, powersgd or noop");
}

void add_model_flags(CLI::App& app, models::WorkloadOptions& options) {
  const FlagGroup group(app, "Model");
  app.add_flag("--tie-weights", options.tie_weights,
               "GPT models: lm_head shares the token embedding's weight (wte), as in GPT-2");
  // nanoGPT's names for the GPT's shape (0: the zoo row's own).
  app.add_option("--n-layer", options.n_layers, "GPT models: transformer blocks")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--n-head", options.n_heads, "GPT models: attention heads (must divide the width)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--n-embd", options.dim, "GPT models: the width (d_model; the same as --dim)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--seq-len", options.seq_len, "GPT models: tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--dropout", options.dropout,
                 "GPT models: dropout in training (embeddings, attention and MLP outputs)")
      ->check(CLI::Range(0.0, 0.99));
  app.add_flag("--sync-bn", options.sync_batch_norm,
               "resnet-small: SyncBatchNorm over the group (PyTorch's convert_sync_batchnorm); "
               "default per-rank BatchNorm statistics");
}

std::string check_model_flags(const std::string& model, const models::WorkloadOptions& options,
                              int64_t tp) {
  const auto tied = models::tied_weights_workload_names();
  const auto shaped = models::shaped_workload_names();
  const bool gpt = std::find(tied.begin(), tied.end(), model) != tied.end();
  if (std::find(shaped.begin(), shaped.end(), model) == shaped.end() &&
      (options.n_layers != 0 || options.n_heads != 0 || options.seq_len != 0 ||
       options.dropout != 0)) {
    return "--n-layer, --n-head, --seq-len and --dropout need a GPT or Llama model, got --model " +
           model;
  }
  if (options.sync_batch_norm && model != "resnet-small") {
    return "--sync-bn needs a model with BatchNorm (resnet-small), got --model " + model;
  }
  if (!gpt && options.dropout != 0) {
    return "--dropout needs a GPT model: --model " + model + " has no dropout";
  }
  if (options.dropout > 0 && tp > 0) {
    return "--dropout cannot be combined with --tp: the ranks of a tp group would drop different "
           "elements of the activations they must share";
  }
  if (!options.tie_weights || std::find(tied.begin(), tied.end(), model) != tied.end()) return "";
  std::string list;
  for (const auto& name : tied) list += (list.empty() ? "" : ", ") + name;
  return "--tie-weights needs a GPT model (" + list + "), got --model " + model +
         ", which has no token embedding to tie";
}

void add_shard_flags(CLI::App& app, ShardFlags& flags) {
  const FlagGroup group(app, "Style");
  app.add_option("--style", flags.style,
                 "data-parallel style: replicate (DistributedDataParallel, the default), "
                 "fully_shard or default (docs/sharding.md)")
      ->check(CLI::IsMember({"replicate", "fully_shard", "default"}));
  app.add_flag("--ddp", flags.ddp, "the same as --style replicate");
  app.add_flag("--fsdp", flags.fsdp, "the same as --style fully_shard");
  app.add_flag("--fsdp-wrap", flags.fsdp_wrap,
               "sharded styles: a unit per block or layer of the model (default: one unit)");
  app.add_option("--reshard-after-forward", flags.options.reshard_after_forward,
                 "sharded styles: release a unit's gathered parameters after its forward")
      ->capture_default_str();
  app.add_flag("--fsdp-checkpoint", flags.checkpoint,
               "activation checkpointing of every block or layer (any style; the seed's flag)");
  app.add_option("--prefetch", flags.options.prefetch,
                 "sharded styles: issue the next unit's all-gather early")
      ->capture_default_str();
  app.add_option("--param-dtype", flags.param_dtype,
                 "sharded styles: gather the parameters and compute in this dtype (FSDP2's "
                 "param_dtype); shards and optimizer state keep theirs")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option(
         "--reduce-dtype", flags.reduce_dtype,
         "sharded styles: reduce-scatter gradients in this dtype (default: --param-dtype's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--local-init", flags.local_init,
               "sharded styles: each rank draws only its shards' initial values, on its device "
               "(FSDP2's meta-device path: fast, the same distributions, not one process's "
               "numbers)");
  app.add_option("--dp-replicate", flags.dp_replicate,
                 "sharded styles: hybrid sharding, R replicas of world / R / --tp shards each: "
                 "gathers and reduce-scatters within a shard group, the gradient shards averaged "
                 "across the replicas (FSDP2's HSDP; docs/sharding.md); 'nodes': one replica per "
                 "node of the launcher (LOCAL_WORLD_SIZE), sharded within the node")
      ->check(CLI::IsMember({"nodes"}) | CLI::Range(int64_t{1}, int64_t{1024}));
}

namespace {
c10::ScalarType dtype_of(const std::string& name) {
  if (name == "bf16") return c10::kBFloat16;
  if (name == "fp16") return c10::kHalf;
  return c10::kFloat;
}
}  // namespace

std::string check_shard_flags(ShardFlags& flags, const std::vector<std::string>& ddp_only) {
  // Each way of naming a style, and the style it names; two that disagree are a contradiction,
  // not a precedence (--fsdp --style replicate once ran fully_shard silently).
  std::vector<std::pair<std::string, std::string>> named;
  if (!flags.style.empty()) named.emplace_back("--style " + flags.style, flags.style);
  if (flags.ddp) named.emplace_back("--ddp", "replicate");
  if (flags.fsdp) named.emplace_back("--fsdp", "fully_shard");
  for (const auto& [flag, style] : named) {
    if (style != named.front().second) {
      return named.front().first + " and " + flag + " name different styles (" +
             named.front().second + ", " + style + "): give one";
    }
  }
  flags.chosen = !named.empty();
  flags.style = flags.chosen ? named.front().second : "replicate";
  flags.options.style = shard::parse_style(flags.style);
  if (flags.sharded() && !ddp_only.empty()) {
    std::string list;
    for (const auto& f : ddp_only) list += (list.empty() ? "" : ", ") + f;
    return "--style " + flags.style + " cannot be combined with " + list +
           " (DistributedDataParallel's)";
  }
  const shard::ShardOptions defaults;
  if (!flags.sharded() &&
      (flags.fsdp_wrap || flags.options.reshard_after_forward != defaults.reshard_after_forward ||
       flags.options.prefetch != defaults.prefetch || !flags.param_dtype.empty() ||
       !flags.reduce_dtype.empty() || !flags.dp_replicate.empty())) {
    return "--fsdp-wrap, --reshard-after-forward, --prefetch, --param-dtype, --reduce-dtype and "
           "--dp-replicate need --fsdp or a sharded --style";
  }
  if (!flags.sharded() && flags.local_init) {
    return "--local-init needs --fsdp or a sharded --style: it initialises this rank's shards";
  }
  if (!flags.param_dtype.empty()) flags.options.param_dtype = dtype_of(flags.param_dtype);
  if (!flags.reduce_dtype.empty()) flags.options.reduce_dtype = dtype_of(flags.reduce_dtype);
  return "";
}

}  // namespace ddp::tools
