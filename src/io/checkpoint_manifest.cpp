#include "ddp/io/checkpoint_manifest.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "c10_errors.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/io/sha256.hpp"

namespace ddp::io {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormatName = "ddp-checkpoint";
using detail::kRngFile;
// CUDA generators are not saved: their draws in a training step are a function of (seed, step)
// through graphs::StepRng, which a resumed run sets as the saved one did (a captured step's
// replays move the generator, so a saved offset would not do).
constexpr const char* kCudaRngNotSaved = "not saved";

std::string manifest_path(const std::string& dir) {
  return (fs::path(dir) / "manifest.json").string();
}

// The field `key` of `j`, of JSON type `T`; a missing or mistyped field names itself.
// Field `key` of object `j`, named in errors as `prefix` + key ("rng.cpu").
template <typename T>
T field(const json& j, const char* key, const std::string& path, const std::string& prefix = "") {
  const auto it = j.find(key);
  TORCH_CHECK(it != j.end(), "ddp: checkpoint manifest ", path, " is invalid: field \"", prefix,
              key, "\" is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    TORCH_CHECK(false, "ddp: checkpoint manifest ", path, " is invalid: field \"", prefix, key,
                "\" has the wrong type (", it->type_name(), "): ", it->dump());
  }
}

// "rng": which file holds the CPU generator (the one a resume restores: kRngFile, listed in
// "files") and what was done with CUDA's ("not saved"). Checked like every other field a resume
// needs: a manifest that names another file, or none, is refused naming the field (the
// coordinator then falls back to an older checkpoint) instead of loading without its RNG state.
void check_rng_field(const json& j, const std::string& path,
                     const std::vector<ManifestFile>& files) {
  const json rng = field<json>(j, "rng", path);
  TORCH_CHECK(rng.is_object(), "ddp: checkpoint manifest ", path,
              " is invalid: field \"rng\" is not an object: ", rng.dump());
  const std::string cpu = field<std::string>(rng, "cpu", path, "rng.");
  TORCH_CHECK(cpu == kRngFile, "ddp: checkpoint manifest ", path,
              " is invalid: field \"rng.cpu\" is \"", cpu, "\", expected \"", kRngFile, "\"");
  const bool listed =
      std::any_of(files.begin(), files.end(), [&](const ManifestFile& f) { return f.name == cpu; });
  TORCH_CHECK(listed, "ddp: checkpoint manifest ", path, " is invalid: field \"rng.cpu\" names ",
              cpu, ", which \"files\" does not list");
  const std::string cuda = field<std::string>(rng, "cuda", path, "rng.");
  TORCH_CHECK(cuda == kCudaRngNotSaved, "ddp: checkpoint manifest ", path,
              " is invalid: field \"rng.cuda\" is \"", cuda, "\", expected \"", kCudaRngNotSaved,
              "\"");
}

// Version 1's rows per rank, read as the layout they were: Shard(0) over a mesh of the writing
// run's ranks, with the even split rule (layout/layout.hpp). Rows of another split are refused.
layout::Layout layout_of_rows(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<std::vector<int64_t>>& rows, int world,
                              const std::string& path) {
  TORCH_CHECK(!shape.empty() && shape[0] >= 0, "ddp: checkpoint manifest ", path,
              " is invalid: sharded parameter '", name, "' has no dim 0 to split");
  TORCH_CHECK(rows.size() == size_t(world), "ddp: checkpoint manifest ", path,
              " is invalid: sharded parameter '", name, "' has ", rows.size(),
              " row ranges for world size ", world);
  layout::Layout out{shape, {world}, {layout::Placement::shard(0, 0)}};
  for (int q = 0; q < world; ++q) {
    const auto& r = rows[size_t(q)];
    TORCH_CHECK(r.size() == 2 && 0 <= r[0] && r[0] <= r[1] && r[1] <= shape[0],
                "ddp: checkpoint manifest ", path, " is invalid: sharded parameter '", name,
                "' has a row range ", json(r).dump(), " outside [0, ", shape[0], "]");
    const auto held = layout::held(out, {q}).dims[0];
    const bool same =
        r[0] == r[1] ? held.empty() : held.size() == 1 && held[0] == layout::Interval{r[0], r[1]};
    TORCH_CHECK(same, "ddp: checkpoint manifest ", path, ": sharded parameter '", name,
                "' has rows ", json(r).dump(), " on rank ", q,
                ", not the even split of its dim 0 that this libddp reads");
  }
  return out;
}

// One placement: {"mesh_dim": 0, "kind": "shard", "dim": 0, "packed": 1} or
// {"mesh_dim": 1, "kind": "replicate"}.
json placement_to_json(const layout::Placement& p) {
  if (p.kind == layout::Placement::Kind::kReplicate)
    return {{"mesh_dim", p.mesh_dim}, {"kind", "replicate"}};
  return {{"mesh_dim", p.mesh_dim}, {"kind", "shard"}, {"dim", p.dim}, {"packed", p.packed}};
}

layout::Placement placement_from_json(const json& j, const std::string& name,
                                      const std::string& path, const std::string& prefix) {
  TORCH_CHECK(j.is_object(), "ddp: checkpoint manifest ", path, " is invalid: parameter '", name,
              "' has a placement that is not an object: ", j.dump());
  const int mesh_dim = field<int>(j, "mesh_dim", path, prefix);
  const std::string kind = field<std::string>(j, "kind", path, prefix);
  if (kind == "replicate") return layout::Placement::replicate(mesh_dim);
  TORCH_CHECK(kind == "shard", "ddp: checkpoint manifest ", path, " is invalid: parameter '", name,
              "' has a placement of kind \"", kind, "\" (not \"shard\" or \"replicate\")");
  return layout::Placement::shard(mesh_dim, field<int64_t>(j, "dim", path, prefix),
                                  field<int64_t>(j, "packed", path, prefix));
}

// The "sharded" list, checked: every tensor once, a valid layout (version 2) or rows of the even
// split (version 1), a mesh of the writing run's ranks, and every file rank within them.
std::vector<ShardedTensor> read_sharded(const json& list, const Manifest& m,
                                        const std::string& path) {
  TORCH_CHECK(list.is_array(), "ddp: checkpoint manifest ", path,
              " is invalid: \"sharded\" is not a list");
  std::vector<ShardedTensor> out;
  for (const json& e : list) {
    TORCH_CHECK(e.is_object(), "ddp: checkpoint manifest ", path,
                " is invalid: an entry of \"sharded\" is not an object: ", e.dump());
    const std::string at = "sharded[" + std::to_string(out.size()) + "].";  // names in errors
    ShardedTensor t;
    t.name = field<std::string>(e, "name", path, at);
    const auto shape = field<std::vector<int64_t>>(e, "shape", path, at);
    t.optimizer_state = field<std::vector<std::string>>(e, "optimizer_state", path, at);
    for (const ShardedTensor& seen : out) {
      TORCH_CHECK(seen.name != t.name, "ddp: checkpoint manifest ", path,
                  " is invalid: sharded parameter '", t.name, "' is listed twice");
    }
    if (m.format_version == 1) {
      t.layout = layout_of_rows(t.name, shape,
                                field<std::vector<std::vector<int64_t>>>(e, "rows", path, at),
                                m.world_size, path);
    } else {
      t.layout.shape = shape;
      t.layout.mesh = field<std::vector<int64_t>>(e, "mesh", path, at);
      const json placements = field<json>(e, "placements", path, at);
      TORCH_CHECK(placements.is_array(), "ddp: checkpoint manifest ", path,
                  " is invalid: parameter '", t.name, "' has placements that are not a list");
      for (const json& p : placements) {
        const std::string placement_at =
            at + "placements[" + std::to_string(t.layout.placements.size()) + "].";
        t.layout.placements.push_back(placement_from_json(p, t.name, path, placement_at));
      }
      try {
        layout::validate(t.layout);
      } catch (const c10::Error& err) {
        TORCH_CHECK(false, "ddp: checkpoint manifest ", path, " is invalid: parameter '", t.name,
                    "': ", err.what_without_backtrace());
      }
      int64_t ranks = 1;
      for (const int64_t size : t.layout.mesh) ranks *= size;
      TORCH_CHECK(ranks == m.world_size, "ddp: checkpoint manifest ", path,
                  " is invalid: parameter '", t.name, "' has a layout over ", ranks,
                  " ranks in a run of world size ", m.world_size);
    }
    out.push_back(std::move(t));
  }
  for (const ManifestFile& f : m.files) {
    TORCH_CHECK(f.rank < m.world_size, "ddp: checkpoint manifest ", path, " is invalid: file '",
                f.name, "' has rank ", f.rank, " in a run of world size ", m.world_size);
  }
  return out;
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  json files = json::array();
  for (const ManifestFile& f : m.files) {
    json entry = {{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}};
    // Replicated files (all of them, until sharded checkpoints) carry no rank: the manifests of
    // today's checkpoints stay byte for byte what they were.
    if (f.rank != kReplicated) entry["rank"] = f.rank;
    files.push_back(std::move(entry));
  }
  json j = {{"format", kFormatName},
            {"format_version", m.format_version},
            {"step", m.step},
            {"data_position", m.data_position},
            {"world_size", m.world_size},
            {"optimizer", m.optimizer},
            {"rng", {{"cpu", kRngFile}, {"cuda", kCudaRngNotSaved}}},
            {"files", files}};
  if (m.global_batch > 0) j["global_batch"] = m.global_batch;
  if (!m.sharded.empty()) {
    json sharded = json::array();
    for (const ShardedTensor& t : m.sharded) {
      json placements = json::array();
      for (const layout::Placement& p : t.layout.placements)
        placements.push_back(placement_to_json(p));
      sharded.push_back({{"name", t.name},
                         {"shape", t.layout.shape},
                         {"mesh", t.layout.mesh},
                         {"placements", placements},
                         {"optimizer_state", t.optimizer_state}});
    }
    j["sharded"] = std::move(sharded);
  }
  return j.dump(2) + "\n";
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = manifest_path(dir);
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.is_open(), "ddp: checkpoint ", dir,
              " is incomplete: manifest.json is missing (a checkpoint is complete only once its "
              "manifest is written)");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    TORCH_CHECK(false, "ddp: checkpoint manifest ", path, " is corrupt: not valid JSON (", e.what(),
                ")");
  }
  TORCH_CHECK(j.is_object(), "ddp: checkpoint manifest ", path, " is invalid: not a JSON object");
  TORCH_CHECK(field<std::string>(j, "format", path) == kFormatName, "ddp: checkpoint manifest ",
              path, " is invalid: format is not \"", kFormatName, "\"");
  Manifest m;
  m.format_version = field<int>(j, "format_version", path);
  TORCH_CHECK(kOldestCheckpointFormatVersion <= m.format_version &&
                  m.format_version <= kCheckpointFormatVersion,
              "ddp: checkpoint manifest ", path, " has format version ", m.format_version,
              "; this libddp reads versions ", kOldestCheckpointFormatVersion, " to ",
              kCheckpointFormatVersion);
  m.step = field<int64_t>(j, "step", path);
  m.data_position = field<int64_t>(j, "data_position", path);
  if (j.contains("global_batch")) m.global_batch = field<int64_t>(j, "global_batch", path);
  m.world_size = field<int>(j, "world_size", path);
  m.optimizer = field<std::string>(j, "optimizer", path);
  const json files = field<json>(j, "files", path);
  TORCH_CHECK(files.is_array(), "ddp: checkpoint manifest ", path,
              " is invalid: \"files\" is not a list");
  for (const json& f : files) {
    TORCH_CHECK(f.is_object(), "ddp: checkpoint manifest ", path,
                " is invalid: an entry of \"files\" is not an object: ", f.dump());
    const std::string at = "files[" + std::to_string(m.files.size()) + "].";  // names in errors
    ManifestFile file;
    file.name = field<std::string>(f, "name", path, at);
    file.bytes = field<uint64_t>(f, "bytes", path, at);
    file.sha256 = field<std::string>(f, "sha256", path, at);
    if (f.contains("rank")) file.rank = field<int>(f, "rank", path, at);
    TORCH_CHECK(file.rank >= kReplicated, "ddp: checkpoint manifest ", path, " is invalid: file '",
                file.name, "' has rank ", file.rank);
    // A name with a separator could point outside the checkpoint directory.
    TORCH_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos &&
                    file.name != "." && file.name != "..",
                "ddp: checkpoint manifest ", path, " is invalid: file name '", file.name,
                "' is not a plain file name");
    m.files.push_back(std::move(file));
  }
  check_rng_field(j, path, m.files);
  if (j.contains("sharded")) m.sharded = read_sharded(field<json>(j, "sharded", path), m, path);
  return m;
}

void verify_manifest_files(const std::string& dir, const Manifest& manifest) {
  for (const ManifestFile& f : manifest.files) verify_manifest_file(dir, f);
}

void verify_manifest_file(const std::string& dir, const ManifestFile& f) {
  const std::string path = (fs::path(dir) / f.name).string();
  std::error_code ec;
  const uint64_t bytes = fs::file_size(path, ec);
  TORCH_CHECK(!ec, "ddp: checkpoint ", path, " is missing: ", ec.message(),
              " (the manifest lists it with ", f.bytes, " bytes)");
  // Size first: a truncated file is named as such without reading it.
  TORCH_CHECK(bytes == f.bytes, "ddp: checkpoint ", path, " is corrupt: ", bytes,
              " bytes != manifest ", f.bytes, " bytes (truncated or overwritten)");
  const std::string sha = as_c10_error([&] { return sha256_file(path); });
  TORCH_CHECK(sha == f.sha256, "ddp: checkpoint ", path, " is corrupt: sha256 ", sha,
              " != manifest ", f.sha256);
}

}  // namespace ddp::io
