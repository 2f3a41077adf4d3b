#include "ddp/io/sharded_checkpoint.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "c10_errors.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/shard/row_pieces.hpp"

namespace ddp::io {
namespace {

namespace fs = std::filesystem;
using detail::kModelFile;
using detail::kOptimFile;
using detail::kRngFile;
using shard::RowRange;

std::string in_dir(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// "<parameter>.<field>" -> {parameter, field}: optimizer state fields have no dot in their name
// (checkpoint_state.hpp), parameter names may.
std::pair<std::string, std::string> split_state_key(const std::string& key) {
  const auto dot = key.rfind('.');
  if (dot == std::string::npos) return {key, ""};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

std::vector<int64_t> sizes_of(const at::Tensor& t) { return t.sizes().vec(); }

// One distinct parameter of the run (tied weights once, under their first name).
struct LiveParam {
  std::string name;
  at::Tensor tensor;          // the module's parameter: this rank's shard, or the full tensor
  std::vector<int64_t> full;  // the full shape
  bool sharded = false;       // split on dim 0 in this run (tensor is [chunk, rest...])
  RowRange rows;              // global rows this rank holds: all of them when not sharded
  size_t plan_index = 0;      // into the shard plan, when there is one
};

// The run's parameters as the plan places them on `rank` (no plan: every parameter full). Each
// sharded one must be its [chunk, ...] shard: the state between steps is what is saved.
std::vector<LiveParam> live_params(const TrainingState& state, int rank, int world) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& item : state.model->named_parameters()) by_name[item.key()] = item.value();
  std::vector<LiveParam> out;
  if (state.shard_plan == nullptr) {
    std::set<const c10::TensorImpl*> seen;
    for (const auto& item : state.model->named_parameters()) {
      const at::Tensor& t = item.value();
      if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
      out.push_back({item.key(), t, sizes_of(t), false, {0, t.dim() > 0 ? t.size(0) : 1}, 0});
    }
    return out;
  }
  const shard::ShardPlan& plan = *state.shard_plan;
  TORCH_CHECK(plan.world == world, wrong_group_for_plan("checkpoint", plan.world, world));
  TORCH_CHECK(0 <= rank && rank < world, "ddp: checkpoint: rank ", rank,
              " is outside the world of size ", world);
  for (size_t i = 0; i < plan.shapes.size(); ++i) {
    const shard::ParamShape& shape = plan.shapes[i];
    const shard::ParamShard& place = plan.params[i];
    const auto it = by_name.find(shape.name);
    TORCH_CHECK(it != by_name.end(), "ddp: checkpoint: the shard plan's parameter '", shape.name,
                "' is not a parameter of the model; pass the module that the ShardedModule wraps");
    LiveParam p{shape.name,
                it->second,
                shape.shape,
                place.placement == shard::Placement::kShard,
                shard::rows_held(place, rank, world),
                i};
    std::vector<int64_t> local = p.full;
    if (p.sharded) local[0] = place.chunk;
    TORCH_CHECK(sizes_of(p.tensor) == local, "ddp: checkpoint: parameter '", p.name, "' has shape ",
                p.tensor.sizes(), " but the shard plan gives it ", at::IntArrayRef(local),
                " on each rank between steps; save and load between steps (after the optimizer "
                "step), not between forward and backward");
    out.push_back(std::move(p));
  }
  return out;
}

// `rows` (a [r, rest...] tensor) at the top of a zero [rows_out, rest...] tensor: a shard with
// its padding rows.
at::Tensor padded(const at::Tensor& rows, int64_t rows_out) {
  if (rows.size(0) == rows_out) return rows;
  std::vector<int64_t> sizes = sizes_of(rows);
  sizes[0] = rows_out;
  at::Tensor out = at::zeros(sizes, rows.options());
  out.narrow(0, 0, rows.size(0)).copy_(rows);
  return out;
}

// A checkpoint's files, each verified against the manifest (size, SHA-256) and loaded the first
// time a tensor of it is wanted, and only then: a rank reads the files that hold its rows.
class CheckpointFiles {
 public:
  CheckpointFiles(std::string dir, const Manifest& manifest)
      : dir_(std::move(dir)), manifest_(manifest) {}

  bool lists(const std::string& name) const { return find(name) != nullptr; }

  // The tensors of file `name`, which the manifest must list as written by `rank`.
  const TensorMap& get(const std::string& name, int rank) {
    const auto cached = loaded_.find(name);
    if (cached != loaded_.end()) return cached->second;
    const ManifestFile* f = find(name);
    TORCH_CHECK(f != nullptr, "ddp: checkpoint ", dir_, " does not list ", name,
                " in its manifest");
    TORCH_CHECK(f->rank == rank, "ddp: checkpoint ", dir_, ": the manifest lists ", name,
                " as rank ", f->rank, "'s, expected rank ", rank, "'s");
    verify_manifest_file(dir_, *f);
    return loaded_.emplace(name, load_safetensors(in_dir(dir_, name))).first->second;
  }

 private:
  const ManifestFile* find(const std::string& name) const {
    for (const ManifestFile& f : manifest_.files)
      if (f.name == name) return &f;
    return nullptr;
  }
  std::string dir_;
  const Manifest& manifest_;
  std::map<std::string, TensorMap> loaded_;
};

// Global rows `wanted` of the tensor `key` of sharded parameter `t` (the parameter itself, or one
// of its optimizer state fields), copied from the rank files that hold them into the top of a
// zero tensor of `rows_out` rows and `dtype`.
at::Tensor rows_from_shards(CheckpointFiles& files, const std::string& dir, const ShardedTensor& t,
                            const std::string& key, bool optimizer_state, RowRange wanted,
                            int64_t rows_out, at::ScalarType dtype) {
  std::vector<int64_t> sizes = t.shape;
  sizes[0] = rows_out;
  at::Tensor out = at::zeros(sizes, at::TensorOptions().dtype(dtype));
  for (const shard::RowPiece& piece : shard::row_pieces(t.rows, wanted)) {
    const std::string name =
        optimizer_state ? optim_shard_file(piece.source) : model_shard_file(piece.source);
    const std::string path = in_dir(dir, name);
    const TensorMap& tensors = files.get(name, piece.source);
    const auto it = tensors.find(key);
    TORCH_CHECK(it != tensors.end(), "ddp: checkpoint ", path, " has no tensor '", key,
                "' although the manifest says rank ", piece.source, " wrote its rows [",
                t.rows[piece.source].begin, ", ", t.rows[piece.source].end, ")");
    std::vector<int64_t> expected = t.shape;
    expected[0] = t.rows[piece.source].size();
    TORCH_CHECK(sizes_of(it->second) == expected, "ddp: checkpoint ", path, ": tensor '", key,
                "' has shape ", it->second.sizes(), " but the manifest's rows [",
                t.rows[piece.source].begin, ", ", t.rows[piece.source].end, ") of shape ",
                at::IntArrayRef(t.shape), " make ", at::IntArrayRef(expected));
    TORCH_CHECK(optimizer_state || it->second.scalar_type() == dtype, "ddp: checkpoint ", path,
                ": tensor '", key, "' has dtype ", it->second.scalar_type(),
                " but the model's has dtype ", dtype);
    out.narrow(0, piece.dest_row, piece.rows)
        .copy_(it->second.narrow(0, piece.source_row, piece.rows));
  }
  return out;
}

}  // namespace

std::string model_shard_file(int rank) {
  return "model.rank-" + std::to_string(rank) + ".safetensors";
}
std::string optim_shard_file(int rank) {
  return "optim.rank-" + std::to_string(rank) + ".safetensors";
}

ShardFiles write_shard_files(const std::string& dir, const TrainingState& state, int rank) {
  TORCH_CHECK(state.model != nullptr, "ddp: checkpoint: TrainingState::model is null");
  TORCH_CHECK(state.shard_plan != nullptr,
              "ddp: checkpoint: write_shard_files needs TrainingState::shard_plan");
  const shard::ShardPlan& plan = *state.shard_plan;
  const std::vector<LiveParam> live = live_params(state, rank, plan.world);

  // This rank's real rows of each sharded parameter (the padding is not saved: it is zero, and
  // another world size pads differently).
  TensorMap model_rows, model_replicated, optim_rows, optim_replicated;
  std::set<const c10::TensorImpl*> sharded_impls;
  std::map<std::string, const LiveParam*> sharded_by_name;
  for (const LiveParam& p : live) {
    if (!p.sharded) continue;
    model_rows[p.name] = p.tensor.detach().narrow(0, 0, p.rows.size());
    sharded_impls.insert(p.tensor.unsafeGetTensorImpl());
    sharded_by_name[p.name] = &p;
  }
  // Everything else as a replicated checkpoint has it (a tied name of a sharded parameter is
  // found by identity on load, so it is not saved twice).
  for (const auto& item : state.model->named_parameters()) {
    if (sharded_impls.count(item.value().unsafeGetTensorImpl()) == 0)
      model_replicated[item.key()] = item.value().detach();
  }
  for (const auto& item : state.model->named_buffers())
    model_replicated[item.key()] = item.value().detach();

  ShardFiles out;
  // Optimizer state of a sharded parameter's shape is split by the same rows; the rest (Adam's
  // step, which every rank holds alike, and the replicated parameters' state) is rank 0's.
  std::map<std::string, std::vector<std::string>> row_fields;
  if (state.optimizer != nullptr) {
    out.optimizer = optimizer_kind(*state.optimizer);
    for (const auto& [key, t] : optimizer_tensors(*state.optimizer, *state.model)) {
      const auto [param, field] = split_state_key(key);
      const auto it = sharded_by_name.find(param);
      if (it != sharded_by_name.end() && t.sizes() == it->second->tensor.sizes()) {
        optim_rows[key] = t.narrow(0, 0, it->second->rows.size());
        row_fields[param].push_back(field);
      } else {
        optim_replicated[key] = t;
      }
    }
  }
  for (const LiveParam& p : live) {
    if (!p.sharded) continue;
    ShardedTensor t{p.name, p.full, {}, row_fields[p.name]};
    for (int q = 0; q < plan.world; ++q)
      t.rows.push_back(shard::rows_held(plan.params[p.plan_index], q, plan.world));
    out.sharded.push_back(std::move(t));
  }

  const std::map<std::string, std::string> meta = {{"format", "ddp-checkpoint"},
                                                   {"step", std::to_string(state.step)},
                                                   {"rank", std::to_string(rank)}};
  const auto write = [&](const std::string& name, const TensorMap& tensors, int owner) {
    save_safetensors(in_dir(dir, name), tensors, meta);
    out.files.push_back(as_c10_error([&] { return detail::describe_file(dir, name, owner); }));
  };
  write(model_shard_file(rank), model_rows, rank);
  if (state.optimizer != nullptr) write(optim_shard_file(rank), optim_rows, rank);
  if (rank == 0) {
    write(kModelFile, model_replicated, kReplicated);
    if (state.optimizer != nullptr) write(kOptimFile, optim_replicated, kReplicated);
    write(kRngFile, rng_tensors(), kReplicated);
  }
  return out;
}

Manifest load_resharded_checkpoint(const std::string& dir, const Manifest& manifest, int rank,
                                   int world_size, TrainingState& state) {
  TORCH_CHECK(state.model != nullptr, "ddp: load_checkpoint: TrainingState::model is null");
  TORCH_CHECK(0 <= rank && rank < world_size, "ddp: load_checkpoint: rank ", rank,
              " is outside the world of size ", world_size);
  const std::vector<LiveParam> live = live_params(state, rank, world_size);
  const std::string manifest_path = in_dir(dir, "manifest.json");
  const std::string model_path = in_dir(dir, kModelFile);
  CheckpointFiles files(dir, manifest);
  const TensorMap& replicated = files.get(kModelFile, kReplicated);
  std::map<std::string, const ShardedTensor*> sharded;
  for (const ShardedTensor& t : manifest.sharded) sharded[t.name] = &t;

  // Another model? Every name and full shape, before a single row is read.
  std::map<std::string, const LiveParam*> live_by_name;
  for (const LiveParam& p : live) {
    live_by_name[p.name] = &p;
    const auto s = sharded.find(p.name);
    if (s != sharded.end()) {
      TORCH_CHECK(s->second->shape == p.full, "ddp: checkpoint ", manifest_path, ": parameter '",
                  p.name, "' has shape ", at::IntArrayRef(s->second->shape),
                  " but the model's has shape ", at::IntArrayRef(p.full),
                  ": was it saved from another model?");
      continue;
    }
    const auto r = replicated.find(p.name);
    TORCH_CHECK(r != replicated.end(), "ddp: checkpoint ", dir, " has no parameter '", p.name,
                "' that the model has (neither in ", kModelFile, " nor sharded in manifest.json)",
                ": was it saved from another model?");
    TORCH_CHECK(sizes_of(r->second) == p.full, "ddp: checkpoint ", model_path, ": parameter '",
                p.name, "' has shape ", r->second.sizes(), " but the model's has shape ",
                at::IntArrayRef(p.full), ": was it saved from another model?");
  }
  for (const ShardedTensor& t : manifest.sharded) {
    TORCH_CHECK(live_by_name.count(t.name) == 1, "ddp: checkpoint ", manifest_path,
                " has sharded parameter '", t.name,
                "' that the model does not have: was it saved from another model?");
  }

  // The model's tensors: each parameter's wanted rows at its local shape; every name of a tied
  // parameter gets its tensor; buffers as rank 0 saved them.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> local;
  for (const LiveParam& p : live) {
    const int64_t rows_out = p.sharded ? p.tensor.size(0) : p.rows.size();
    at::Tensor t;
    const auto s = sharded.find(p.name);
    if (s != sharded.end()) {
      t = rows_from_shards(files, dir, *s->second, p.name, false, p.rows, rows_out,
                           p.tensor.scalar_type());
    } else {
      const at::Tensor& full = replicated.at(p.name);
      t = p.sharded ? padded(full.narrow(0, p.rows.begin, p.rows.size()), rows_out) : full;
    }
    local[p.tensor.unsafeGetTensorImpl()] = t;
  }
  TensorMap model;
  for (const auto& item : state.model->named_parameters())
    model[item.key()] = local.at(item.value().unsafeGetTensorImpl());
  for (const auto& [name, t] : replicated) {
    if (model.count(name) == 0 && live_by_name.count(name) == 0) model[name] = t;
  }
  check_model_tensors(*state.model, model, model_path);

  std::optional<TensorMap> optim;
  const std::string optim_path = in_dir(dir, kOptimFile);
  if (state.optimizer != nullptr) {
    const std::string kind = optimizer_kind(*state.optimizer);
    TORCH_CHECK(manifest.optimizer == kind && files.lists(kOptimFile), "ddp: checkpoint ", dir,
                " holds ",
                manifest.optimizer.empty() ? std::string("no optimizer state")
                                           : "the state of a " + manifest.optimizer + " optimizer",
                " but this run uses ", kind);
    optim.emplace();
    // Replicated state: a tensor of its parameter's full shape follows the parameter's rows
    // (a parameter saved replicated may be sharded now); others (Adam's step) as they are.
    for (const auto& [key, t] : files.get(kOptimFile, kReplicated)) {
      const auto it = live_by_name.find(split_state_key(key).first);
      const bool row_shaped =
          it != live_by_name.end() && it->second->sharded && sizes_of(t) == it->second->full;
      (*optim)[key] = row_shaped
                          ? padded(t.narrow(0, it->second->rows.begin, it->second->rows.size()),
                                   it->second->tensor.size(0))
                          : t;
    }
    for (const ShardedTensor& t : manifest.sharded) {
      const LiveParam& p = *live_by_name.at(t.name);
      const int64_t rows_out = p.sharded ? p.tensor.size(0) : p.rows.size();
      for (const std::string& field : t.optimizer_state) {
        const std::string key = t.name + "." + field;
        (*optim)[key] =
            rows_from_shards(files, dir, t, key, true, p.rows, rows_out, p.tensor.scalar_type());
      }
    }
  }
  const std::string rng_path = in_dir(dir, kRngFile);
  const TensorMap& rng = files.get(kRngFile, kReplicated);
  check_rng_tensors(rng, rng_path);

  // Every file is read and every check passed: now the changes. The optimizer's state is built
  // aside and swapped in by load_optimizer_tensors, which refuses before changing anything.
  if (optim) load_optimizer_tensors(*state.optimizer, *state.model, *optim, optim_path);
  load_model_tensors(*state.model, model, model_path);
  load_rng_tensors(rng, rng_path);
  state.step = manifest.step;
  state.data_position = manifest.data_position;
  return manifest;
}

std::string wrong_group_for_plan(const std::string& who, int plan_world, int group_ranks) {
  return "ddp: " + who + ": the shard plan is for world size " + std::to_string(plan_world) +
         " but the group has " + std::to_string(group_ranks) +
         " ranks; pass the sharded runtime's own group (the mesh's \"dp\" group when it shards "
         "over one mesh dim). A sharded style over tensor parallelism is checkpointed through "
         "its nested layouts instead: TrainingState::layouts = {layout::nest(tp.layouts(), "
         "sharded.layouts()), mesh.parent()}, without shard_plan";
}

}  // namespace ddp::io
