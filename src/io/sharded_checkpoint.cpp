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
#include "checkpoint_contents.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/safetensors.hpp"

namespace ddp::io {
namespace {

namespace fs = std::filesystem;
using detail::kModelFile;
using detail::kOptimFile;
using detail::kRngFile;

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

bool splits(const layout::Layout& l) {
  for (const layout::Placement& p : l.placements)
    if (p.kind == layout::Placement::Kind::kShard) return true;
  return false;
}

// Whether `coordinate` writes its piece of a tensor under `l`: the first holder of each replica,
// i.e. coordinate 0 on every mesh dim that does not split it (layout::pieces reads replicated
// mesh dims at coordinate 0 only, so the other replicas' copies would never be read).
bool first_holder(const layout::Layout& l, const std::vector<int64_t>& coordinate) {
  for (size_t d = 0; d < l.mesh.size(); ++d) {
    bool split_here = false;
    for (const layout::Placement& p : l.placements)
      split_here |= p.mesh_dim == int(d) && p.kind == layout::Placement::Kind::kShard;
    if (!split_here && coordinate[d] != 0) return false;
  }
  return true;
}

// One distinct parameter of the run (tied weights once, under their first name).
struct LiveParam {
  std::string name;
  at::Tensor tensor;      // the module's parameter: this rank's local storage
  layout::Layout layout;  // as the run's layouts place it (whole when it registers none)
  bool split = false;     // some placement shards it: the rank files hold it
};

// The run's layouts: the registered ones, or every parameter whole on one coordinate.
const layout::TensorLayouts& layouts_of(const TrainingState& state) {
  static const layout::TensorLayouts kWhole;
  return state.split_layouts() != nullptr ? *state.split_layouts() : kWhole;
}

// The run's parameters as its layouts place them. Each must be its local storage
// (layout::padded_local_shape): the state between steps is what is saved and loaded.
std::vector<LiveParam> live_params(const TrainingState& state) {
  const layout::TensorLayouts& layouts = layouts_of(state);
  TORCH_CHECK(layouts.coordinate.size() == layouts.mesh.size(),
              "ddp: checkpoint: TrainingState::sharding has a coordinate of ",
              layouts.coordinate.size(), " dims on a mesh of ", layouts.mesh.size());
  std::vector<LiveParam> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : state.model->named_parameters()) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    LiveParam p{item.key(), t, layouts.of(item.key(), sizes_of(t)), false};
    p.split = splits(p.layout);
    const std::vector<int64_t> storage = layout::padded_local_shape(p.layout);
    TORCH_CHECK(sizes_of(t) == storage, "ddp: checkpoint: parameter '", p.name, "' has shape ",
                t.sizes(), " but its layout (", layout::describe(p.layout), ") gives it ",
                at::IntArrayRef(storage),
                " on each rank between steps; save and load between steps (after the optimizer "
                "step), not between forward and backward");
    out.push_back(std::move(p));
  }
  return out;
}

// `whole` (a tensor of `wanted.shape`) cut to what `coordinate` stores under `wanted`: its local
// piece at the top of zero padding (layout::padded_local_shape), or `whole` itself when it is
// not split.
at::Tensor local_of_whole(const at::Tensor& whole, const layout::Layout& wanted,
                          const std::vector<int64_t>& coordinate) {
  if (!splits(wanted)) return whole;
  at::Tensor out = at::zeros(layout::padded_local_shape(wanted), whole.options());
  const layout::Layout saved = layout::Layout::replicated(wanted.shape);
  for (const layout::Piece& piece : layout::pieces(saved, wanted, coordinate))
    comm::copy_piece(piece, whole, out);
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

// What `coordinate` stores under `wanted` of the tensor `key` of split tensor `t` (the parameter
// itself, or one of its optimizer state fields), copied by layout::pieces out of the rank files
// that hold it into zeros of layout::padded_local_shape(wanted) and `dtype`.
at::Tensor local_from_rank_files(CheckpointFiles& files, const std::string& dir,
                                 const ShardedTensor& t, const std::string& key,
                                 bool optimizer_state, const layout::Layout& wanted,
                                 const std::vector<int64_t>& coordinate, at::ScalarType dtype) {
  at::Tensor out = at::zeros(layout::padded_local_shape(wanted), at::TensorOptions().dtype(dtype));
  for (const layout::Piece& piece : layout::pieces(t.layout, wanted, coordinate)) {
    const int source = int(layout::rank_of(piece.source, t.layout.mesh));
    const std::string name = optimizer_state ? optim_shard_file(source) : model_shard_file(source);
    const std::string path = in_dir(dir, name);
    const TensorMap& tensors = files.get(name, source);
    const auto it = tensors.find(key);
    TORCH_CHECK(it != tensors.end(), "ddp: checkpoint ", path, " has no tensor '", key,
                "' although the manifest says rank ", source, " wrote its piece of ",
                layout::describe(t.layout));
    const std::vector<int64_t> expected = layout::local_shape(t.layout, piece.source);
    TORCH_CHECK(sizes_of(it->second) == expected, "ddp: checkpoint ", path, ": tensor '", key,
                "' has shape ", it->second.sizes(), " but rank ", source, "'s piece of ",
                layout::describe(t.layout), " has shape ", at::IntArrayRef(expected));
    TORCH_CHECK(optimizer_state || it->second.scalar_type() == dtype, "ddp: checkpoint ", path,
                ": tensor '", key, "' has dtype ", it->second.scalar_type(),
                " but the model's has dtype ", dtype);
    comm::copy_piece(piece, it->second, out);
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

namespace detail {

CheckpointContents rank_contents(const TrainingState& state, int rank) {
  TORCH_CHECK(state.model != nullptr, "ddp: checkpoint: TrainingState::model is null");
  const layout::TensorLayouts& layouts = layouts_of(state);
  const std::vector<LiveParam> live = live_params(state);
  const std::vector<int64_t>& coordinate = layouts.coordinate;
  // Nothing split (DDP, one process): rank 0 writes everything whole, whatever its coordinate.
  TORCH_CHECK(state.split_layouts() == nullptr || layout::rank_of(coordinate, layouts.mesh) == rank,
              "ddp: checkpoint: rank ", rank, " writes the files of mesh coordinate ",
              at::IntArrayRef(coordinate), ", which is rank ",
              layout::rank_of(coordinate, layouts.mesh),
              " of the layouts' mesh: pass the group the layouts are over");

  // This rank's real piece of each split parameter it holds first (the padding is not saved: it
  // is zero, and another mesh pads differently).
  TensorMap model_pieces, model_replicated, optim_pieces, optim_replicated;
  std::set<const c10::TensorImpl*> split_impls;
  std::map<std::string, const LiveParam*> split_by_name;
  for (const LiveParam& p : live) {
    if (!p.split) continue;
    if (first_holder(p.layout, coordinate)) {
      model_pieces[p.name] = comm::real_local(p.layout, p.tensor.detach(), coordinate,
                                              "checkpoint: parameter '" + p.name + "'");
    }
    split_impls.insert(p.tensor.unsafeGetTensorImpl());
    split_by_name[p.name] = &p;
  }
  // Everything else as a replicated checkpoint has it (a tied name of a split parameter is found
  // by identity on load, so it is not saved twice).
  for (const auto& item : state.model->named_parameters()) {
    if (split_impls.count(item.value().unsafeGetTensorImpl()) == 0)
      model_replicated[item.key()] = item.value().detach();
  }
  for (const auto& item : state.model->named_buffers())
    model_replicated[item.key()] = item.value().detach();

  CheckpointContents out;
  // Optimizer state of a split parameter's local shape is split by the same layout; the rest
  // (Adam's step, which every rank holds alike, and the whole parameters' state) is rank 0's.
  std::map<std::string, std::vector<std::string>> split_fields;
  if (state.optimizer != nullptr) {
    out.optimizer = optimizer_kind(*state.optimizer);
    for (const auto& [key, t] : optimizer_tensors(*state.optimizer, *state.model)) {
      const auto [param, field] = split_state_key(key);
      const auto it = split_by_name.find(param);
      if (it != split_by_name.end() && t.sizes() == it->second->tensor.sizes()) {
        if (first_holder(it->second->layout, coordinate)) {
          optim_pieces[key] = comm::real_local(it->second->layout, t, coordinate,
                                               "checkpoint: optimizer state '" + key + "'");
        }
        split_fields[param].push_back(field);
      } else {
        optim_replicated[key] = t;
      }
    }
  }
  for (const LiveParam& p : live) {
    if (p.split) out.sharded.push_back({p.name, p.layout, split_fields[p.name]});
  }

  out.metadata = {{"format", "ddp-checkpoint"},
                  {"step", std::to_string(state.step)},
                  {"rank", std::to_string(rank)}};
  // A rank that holds no first piece (a replica of another's, under DDP over TP) writes no
  // rank file: nothing would read it.
  if (!model_pieces.empty()) out.files.push_back({model_shard_file(rank), model_pieces, rank});
  if (!optim_pieces.empty()) out.files.push_back({optim_shard_file(rank), optim_pieces, rank});
  if (rank == 0) {
    out.files.push_back({kModelFile, model_replicated, kReplicated});
    if (state.optimizer != nullptr)
      out.files.push_back({kOptimFile, optim_replicated, kReplicated});
    out.files.push_back({kRngFile, rng_tensors(), kReplicated});
  }
  return out;
}

}  // namespace detail

ShardFiles write_shard_files(const std::string& dir, const TrainingState& state, int rank) {
  detail::CheckpointContents contents = detail::rank_contents(state, rank);
  return {detail::write_contents(dir, contents), std::move(contents.sharded),
          std::move(contents.optimizer)};
}

Manifest load_resharded_checkpoint(const std::string& dir, const Manifest& manifest,
                                   TrainingState& state) {
  TORCH_CHECK(state.model != nullptr, "ddp: load_checkpoint: TrainingState::model is null");
  const std::vector<LiveParam> live = live_params(state);
  const std::vector<int64_t>& coordinate = layouts_of(state).coordinate;
  const std::string manifest_path = in_dir(dir, "manifest.json");
  const std::string model_path = in_dir(dir, kModelFile);
  CheckpointFiles files(dir, manifest);
  const TensorMap& replicated = files.get(kModelFile, kReplicated);
  std::map<std::string, const ShardedTensor*> sharded;
  for (const ShardedTensor& t : manifest.sharded) sharded[t.name] = &t;

  // Another model? Every name and whole shape, before a single piece is read.
  std::map<std::string, const LiveParam*> live_by_name;
  for (const LiveParam& p : live) {
    live_by_name[p.name] = &p;
    const auto s = sharded.find(p.name);
    if (s != sharded.end()) {
      TORCH_CHECK(s->second->layout.shape == p.layout.shape, "ddp: checkpoint ", manifest_path,
                  ": parameter '", p.name, "' has shape ", at::IntArrayRef(s->second->layout.shape),
                  " but the model's has shape ", at::IntArrayRef(p.layout.shape),
                  ": was it saved from another model?");
      continue;
    }
    const auto r = replicated.find(p.name);
    TORCH_CHECK(r != replicated.end(), "ddp: checkpoint ", dir, " has no parameter '", p.name,
                "' that the model has (neither in ", kModelFile, " nor sharded in manifest.json)",
                ": was it saved from another model?");
    TORCH_CHECK(sizes_of(r->second) == p.layout.shape, "ddp: checkpoint ", model_path,
                ": parameter '", p.name, "' has shape ", r->second.sizes(),
                " but the model's has shape ", at::IntArrayRef(p.layout.shape),
                ": was it saved from another model?");
  }
  for (const ShardedTensor& t : manifest.sharded) {
    TORCH_CHECK(live_by_name.count(t.name) == 1, "ddp: checkpoint ", manifest_path,
                " has sharded parameter '", t.name,
                "' that the model does not have: was it saved from another model?");
  }

  // The model's tensors: each parameter's wanted piece at its local storage shape; every name of
  // a tied parameter gets its tensor; buffers as rank 0 saved them.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> local;
  for (const LiveParam& p : live) {
    const auto s = sharded.find(p.name);
    local[p.tensor.unsafeGetTensorImpl()] =
        s != sharded.end() ? local_from_rank_files(files, dir, *s->second, p.name, false, p.layout,
                                                   coordinate, p.tensor.scalar_type())
                           : local_of_whole(replicated.at(p.name), p.layout, coordinate);
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
    // Replicated state: a tensor of its parameter's whole shape follows the parameter's layout
    // (a parameter saved whole may be split now); others (Adam's step) as they are.
    for (const auto& [key, t] : files.get(kOptimFile, kReplicated)) {
      const auto it = live_by_name.find(split_state_key(key).first);
      const bool param_shaped =
          it != live_by_name.end() && it->second->split && sizes_of(t) == it->second->layout.shape;
      (*optim)[key] = param_shaped ? local_of_whole(t, it->second->layout, coordinate) : t;
    }
    for (const ShardedTensor& t : manifest.sharded) {
      const LiveParam& p = *live_by_name.at(t.name);
      for (const std::string& field : t.optimizer_state) {
        const std::string key = t.name + "." + field;
        (*optim)[key] = local_from_rank_files(files, dir, t, key, true, p.layout, coordinate,
                                              p.tensor.scalar_type());
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
  if (state.global_batch == 0) state.global_batch = manifest.global_batch;
  return manifest;
}

std::string wrong_group_for_sharding(const std::string& who, int layout_ranks, int group_ranks) {
  return "ddp: " + who + ": the sharding is over a mesh of " + std::to_string(layout_ranks) +
         " ranks but the group has " + std::to_string(group_ranks) +
         "; pass the group the sharding is over (its mesh group: a sharded runtime's own group; "
         "for a sharded style over tensor parallelism, the nested sharding "
         "model.sharding(*tp, mesh.parent()) with the mesh's parent group)";
}

void check_sharding_group(const std::string& who, const layout::TensorLayouts& layouts,
                          int world_size, int rank) {
  int64_t ranks = 1;
  for (const int64_t size : layouts.mesh) ranks *= size;
  TORCH_CHECK(ranks == world_size, wrong_group_for_sharding(who, int(ranks), world_size));
  TORCH_CHECK(layouts.coordinate.size() == layouts.mesh.size() &&
                  layout::rank_of(layouts.coordinate, layouts.mesh) == rank,
              "ddp: ", who, ": rank ", rank, " of the group is not the layouts' coordinate ",
              at::IntArrayRef(layouts.coordinate), " on mesh ", at::IntArrayRef(layouts.mesh),
              "; pass the group the layouts were made over");
}

}  // namespace ddp::io
