#include "ddp/io/checkpoint_manifest.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "c10_errors.hpp"
#include "ddp/io/sha256.hpp"

namespace ddp::io {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormatName = "ddp-checkpoint";

std::string manifest_path(const std::string& dir) {
  return (fs::path(dir) / "manifest.json").string();
}

// The field `key` of `j`, of JSON type `T`; a missing or mistyped field names itself.
template <typename T>
T field(const json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  TORCH_CHECK(it != j.end(), "ddp: checkpoint manifest ", path, " is invalid: field \"", key,
              "\" is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    TORCH_CHECK(false, "ddp: checkpoint manifest ", path, " is invalid: field \"", key,
                "\" has the wrong type (", it->type_name(), "): ", it->dump());
  }
}

// The "sharded" list, checked: every parameter once, a shape with a dim 0, one row range per rank
// of the writing run, each inside [0, dim 0), and every file rank within the world.
std::vector<ShardedTensor> read_sharded(const json& list, const Manifest& m,
                                        const std::string& path) {
  TORCH_CHECK(list.is_array(), "ddp: checkpoint manifest ", path,
              " is invalid: \"sharded\" is not a list");
  std::vector<ShardedTensor> out;
  for (const json& e : list) {
    TORCH_CHECK(e.is_object(), "ddp: checkpoint manifest ", path,
                " is invalid: an entry of \"sharded\" is not an object: ", e.dump());
    ShardedTensor t;
    t.name = field<std::string>(e, "name", path);
    t.shape = field<std::vector<int64_t>>(e, "shape", path);
    const auto rows = field<std::vector<std::vector<int64_t>>>(e, "rows", path);
    t.optimizer_state = field<std::vector<std::string>>(e, "optimizer_state", path);
    for (const ShardedTensor& seen : out) {
      TORCH_CHECK(seen.name != t.name, "ddp: checkpoint manifest ", path,
                  " is invalid: sharded parameter '", t.name, "' is listed twice");
    }
    TORCH_CHECK(!t.shape.empty() && t.shape[0] >= 0, "ddp: checkpoint manifest ", path,
                " is invalid: sharded parameter '", t.name, "' has no dim 0 to split");
    TORCH_CHECK(rows.size() == size_t(m.world_size), "ddp: checkpoint manifest ", path,
                " is invalid: sharded parameter '", t.name, "' has ", rows.size(),
                " row ranges for world size ", m.world_size);
    for (const auto& r : rows) {
      TORCH_CHECK(r.size() == 2 && 0 <= r[0] && r[0] <= r[1] && r[1] <= t.shape[0],
                  "ddp: checkpoint manifest ", path, " is invalid: sharded parameter '", t.name,
                  "' has a row range ", json(r).dump(), " outside [0, ", t.shape[0], "]");
      t.rows.push_back({r[0], r[1]});
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
            // CUDA generators are not captured: the CPU build has none, and the CUDA build
            // draws no random numbers in the training paths we checkpoint.
            {"rng", {{"cpu", "rng.safetensors"}, {"cuda", "not saved"}}},
            {"files", files}};
  if (!m.sharded.empty()) {
    json sharded = json::array();
    for (const ShardedTensor& t : m.sharded) {
      json rows = json::array();
      for (const shard::RowRange& r : t.rows) rows.push_back({r.begin, r.end});
      sharded.push_back({{"name", t.name},
                         {"shape", t.shape},
                         {"rows", rows},
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
  TORCH_CHECK(m.format_version == kCheckpointFormatVersion, "ddp: checkpoint manifest ", path,
              " has format version ", m.format_version, "; this libddp reads version ",
              kCheckpointFormatVersion);
  m.step = field<int64_t>(j, "step", path);
  m.data_position = field<int64_t>(j, "data_position", path);
  m.world_size = field<int>(j, "world_size", path);
  m.optimizer = field<std::string>(j, "optimizer", path);
  const json files = field<json>(j, "files", path);
  TORCH_CHECK(files.is_array(), "ddp: checkpoint manifest ", path,
              " is invalid: \"files\" is not a list");
  for (const json& f : files) {
    TORCH_CHECK(f.is_object(), "ddp: checkpoint manifest ", path,
                " is invalid: an entry of \"files\" is not an object: ", f.dump());
    ManifestFile file;
    file.name = field<std::string>(f, "name", path);
    file.bytes = field<uint64_t>(f, "bytes", path);
    file.sha256 = field<std::string>(f, "sha256", path);
    if (f.contains("rank")) file.rank = field<int>(f, "rank", path);
    TORCH_CHECK(file.rank >= kReplicated, "ddp: checkpoint manifest ", path, " is invalid: file '",
                file.name, "' has rank ", file.rank);
    // A name with a separator could point outside the checkpoint directory.
    TORCH_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos &&
                    file.name != "." && file.name != "..",
                "ddp: checkpoint manifest ", path, " is invalid: file name '", file.name,
                "' is not a plain file name");
    m.files.push_back(std::move(file));
  }
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
