// Sharded checkpoints (io/sharded_checkpoint.hpp) and the full state dict (io/full_state_dict.hpp)
// on Gloo: a checkpoint saved by a ShardedModule run at world 3 resumes at world 2 and at world 1
// and ends within 1e-5 of one uninterrupted single-process run on the same global batches
// (SGD + momentum and Adam, fully_shard and default); a corrupt shard file is refused by name
// (and at an unchanged world size only the ranks that read it notice); a checkpoint of another
// model is refused naming the parameter and the file, changing nothing; the exported full state
// loads into a plain single-process model (C++ and Python's torch.load) and equals the oracle.

#include "ddp/io/sharded_checkpoint.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/io/torch_save.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/oracle_twin.hpp"
#include "support/pytorch_required.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "support/training_state.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSteps = 3;        // before the checkpoint, and again after it
constexpr int64_t kGlobalBatch = 6;  // divides world 1, 2 and 3

// dim 0: 7 (uneven at world 2 and 3), 3 (uneven at 2; under DEFAULT sharded at 3, replicated at
// 2), 2 (at world 3 the last rank holds no row; under DEFAULT replicated at 3, sharded at 2).
torch::nn::Sequential make_net(int64_t hidden = 7, bool extra_layer = false) {
  torch::nn::Sequential net(torch::nn::Linear(5, hidden), torch::nn::ReLU(),
                            torch::nn::Linear(hidden, 3), torch::nn::Linear(3, 2));
  if (extra_layer) net->push_back(torch::nn::Linear(2, 2));
  return net;
}

struct Batches {
  std::vector<torch::Tensor> xs, ys;
};

Batches global_batches() {
  torch::manual_seed(1);
  Batches b;
  for (int64_t s = 0; s < 2 * kSteps; ++s) {
    b.xs.push_back(torch::randn({kGlobalBatch, 5}));
    b.ys.push_back(torch::randn({kGlobalBatch, 2}));
  }
  return b;
}

// The uninterrupted single-process run: `steps` steps on the whole global batches.
io::TensorMap oracle(const std::string& optimizer, int64_t steps = 2 * kSteps) {
  torch::manual_seed(0);
  auto net = make_net();
  auto opt = make_test_optimizer(optimizer, net->parameters());
  const Batches b = global_batches();
  for (int64_t s = 0; s < steps; ++s) {
    torch::mse_loss(net->forward(b.xs[s]), b.ys[s]).backward();
    opt->step();
    opt->zero_grad();
  }
  return io::model_tensors(*net);
}

void require_close_maps(const io::TensorMap& got, const io::TensorMap& want,
                        const std::string& context) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> a, b;
  for (const auto& [name, t] : want) {
    require(got.count(name) == 1, context + ": no tensor '" + name + "'");
    names.push_back(name);
    a.push_back(got.at(name));
    b.push_back(t);
  }
  require(got.size() == want.size(), context + ": " + std::to_string(got.size()) +
                                         " tensors, the oracle has " + std::to_string(want.size()));
  require_close(names, a, b, 1e-5, context);
}

shard::ShardOptions style_options(const std::string& style) {
  shard::ShardOptions options;
  options.style = shard::parse_style(style);
  return options;
}

// A run of sharded_checkpoint_train: the optimizer and the style are the test's parameter, the
// rest the test body sets.
struct Case {
  std::string optimizer, style;
  std::string root{};        // the checkpoint root
  bool resume = false;       // the resume phase (else the save phase)
  std::string export_dir{};  // where the resume phase exports the full state; empty: nowhere
  DDP_CASE_FIELDS(optimizer, style, root, resume, export_dir)
};

// The save phase: kSteps steps from the oracle's initial parameters, then save_and_barrier.
// The resume phase: from other initial parameters, resume_latest, kSteps more steps, compare with
// the oracle; with an export_dir, export the full state there and load it into a plain model.
DDP_TEST_WORKER_WITH(sharded_checkpoint_train, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const bool resume = c.resume;
  const std::string& optimizer = c.optimizer;
  // A resumed run starts elsewhere: the checkpoint must overwrite every shard and every state.
  torch::manual_seed(resume ? 100 + r : 0);
  auto net = make_net();
  shard::FullyShardedDataParallel<torch::nn::Sequential> model(net, pg, style_options(c.style));
  auto opt = make_test_optimizer(optimizer, net->parameters());
  io::TrainingState state = training_state(net.ptr().get(), opt.get(), model.sharding());
  io::CoordinatorOptions options;
  options.root = c.root;

  int64_t first = 0;
  if (resume) {
    const auto entry = io::resume_latest(*pg, options, state);
    require(entry && entry->step == kSteps && state.step == kSteps &&
                state.data_position == kSteps * kGlobalBatch,
            "did not resume from step " + std::to_string(kSteps));
    first = kSteps;
  }
  const Batches b = global_batches();
  const int64_t per_rank = kGlobalBatch / w;
  for (int64_t s = first; s < first + kSteps; ++s) {
    torch::mse_loss(model(b.xs[s].narrow(0, r * per_rank, per_rank)),
                    b.ys[s].narrow(0, r * per_rank, per_rank))
        .backward();
    opt->step();
    opt->zero_grad();
  }
  if (!resume) {
    state.step = kSteps;
    state.data_position = kSteps * kGlobalBatch;
    io::save_and_barrier(*pg, options, state);
    return;
  }
  const io::TensorMap want = oracle(optimizer);
  // The one export path: every parameter gathered by its layout, on every rank.
  const io::TensorMap whole = io::whole_state(*net, model.layouts(), pg.get());
  require_close_maps(whole, want, "resumed at world " + std::to_string(w));

  const std::string& export_dir = c.export_dir;
  if (export_dir.empty() || r != 0) return;
  for (const std::string name : {"export.safetensors", "export.pt"}) {
    const std::string path = (fs::path(export_dir) / name).string();
    io::save_weights(path, whole);
    auto plain = make_net();  // a single-process model that knows nothing of shards
    io::load_model_tensors(*plain, io::load_weights(path), path);
    require_close_maps(io::model_tensors(*plain), want, "exported " + name);
  }
  io::save_torch((fs::path(export_dir) / "oracle.pt").string(), want);
}

void PrintTo(const Case& c, std::ostream* out) { *out << c.optimizer << " " << c.style; }

class ShardedCheckpointResume : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedCheckpointResume, SavedAtThreeResumesAtTwoAndOneAsAnUninterruptedRun) {
  Case c = GetParam();
  TempDir root("sharded_ckpt");
  c.root = root.str();
  auto result = run_workers(sharded_checkpoint_train, 3, c);
  ASSERT_TRUE(result.ok()) << result.describe();

  // What the format promises: every rank's files, one manifest with each file's writer and each
  // split parameter's layout: Shard(0) over the 3 ranks, which holds the rows listed per rank.
  const std::string dir = io::checkpoint_dir(root.str(), kSteps);
  const io::Manifest m = io::verify_checkpoint(dir);
  EXPECT_EQ(m.world_size, 3);
  EXPECT_EQ(m.optimizer, c.optimizer);
  std::set<std::string> files;
  for (const auto& f : m.files) files.insert(f.name + "@" + std::to_string(f.rank));
  std::set<std::string> expected = {"model.safetensors@-1", "optim.safetensors@-1",
                                    "rng.safetensors@-1"};
  for (int rank = 0; rank < 3; ++rank) {
    expected.insert(io::model_shard_file(rank) + "@" + std::to_string(rank));
    expected.insert(io::optim_shard_file(rank) + "@" + std::to_string(rank));
  }
  EXPECT_EQ(files, expected);
  const std::string fields = c.optimizer == "adam" ? "exp_avg,exp_avg_sq" : "momentum_buffer";
  std::map<std::string, std::string> table;
  for (const io::ShardedTensor& t : m.sharded) {
    EXPECT_EQ(t.layout.mesh, (std::vector<int64_t>{3})) << t.name;
    EXPECT_EQ(t.layout.placements, (std::vector<layout::Placement>{layout::Placement::shard(0, 0)}))
        << t.name;
    std::string text;
    for (int64_t q = 0; q < 3; ++q) {
      const auto rows = layout::held(t.layout, {q}).dims[0];
      if (rows.empty()) text += "[]";
      for (const auto& r : rows)
        text += "[" + std::to_string(r.begin) + "," + std::to_string(r.end) + ")";
    }
    std::string state;
    for (const auto& f : t.optimizer_state) state += (state.empty() ? "" : ",") + f;
    EXPECT_EQ(state, fields) << t.name;
    table[t.name] = text;
  }
  if (c.style == "fully_shard") {
    EXPECT_EQ(table, (std::map<std::string, std::string>{{"0.weight", "[0,3)[3,6)[6,7)"},
                                                         {"0.bias", "[0,3)[3,6)[6,7)"},
                                                         {"2.weight", "[0,1)[1,2)[2,3)"},
                                                         {"2.bias", "[0,1)[1,2)[2,3)"},
                                                         {"3.weight", "[0,1)[1,2)[]"},
                                                         {"3.bias", "[0,1)[1,2)[]"}}));
  } else {  // default at world 3: only dim 0 = 3 divides
    EXPECT_EQ(table, (std::map<std::string, std::string>{{"2.weight", "[0,1)[1,2)[2,3)"},
                                                         {"2.bias", "[0,1)[1,2)[2,3)"}}));
  }
  // The padding is not saved: rank 2 wrote one row of 0.weight and none of 3.weight.
  if (c.style == "fully_shard") {
    const auto last = io::load_safetensors(dir + "/" + io::model_shard_file(2));
    EXPECT_EQ(last.at("0.weight").sizes().vec(), (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(last.at("3.weight").sizes().vec(), (std::vector<int64_t>{0, 3}));
  }

  TempDir exported("sharded_export");
  c.resume = true;
  c.export_dir = exported.str();
  result = run_workers(sharded_checkpoint_train, 2, c);
  ASSERT_TRUE(result.ok()) << result.describe();
  c.export_dir.clear();
  result = run_workers(sharded_checkpoint_train, 1, c);
  ASSERT_TRUE(result.ok()) << result.describe();

  // Every field of a "sharded" entry is checked and named (issue 49): one change at a time, each
  // refused by read_manifest with its exact text, then the manifest restored.
  {
    const std::string path = dir + "/manifest.json";
    const std::string original = read_file(path);
    const nlohmann::json intact = nlohmann::json::parse(original);
    const std::string name = intact["sharded"][0]["name"];
    const std::string invalid = "ddp: checkpoint manifest " + path + " is invalid: ";
    const std::vector<std::tuple<const char*, nlohmann::json, std::string>> cases = {
        {"/sharded", nlohmann::json::object(), "\"sharded\" is not a list"},
        {"/sharded/0/name", 1, "field \"sharded[0].name\" has the wrong type (number): 1"},
        {"/sharded/0/shape", "x", "field \"sharded[0].shape\" has the wrong type (string): \"x\""},
        {"/sharded/0/optimizer_state", 0,
         "field \"sharded[0].optimizer_state\" has the wrong type (number): 0"},
        {"/sharded/0/mesh", nlohmann::json::array({2, 2}),
         "parameter '" + name + "' has a layout over 4 ranks in a run of world size 3"},
        {"/sharded/0/placements", nlohmann::json::object(),
         "parameter '" + name + "' has placements that are not a list"},
        {"/sharded/0/placements/0/kind", "split",
         "parameter '" + name +
             "' has a placement of kind \"split\" (not \"shard\" or \"replicate\")"},
        {"/sharded/0/placements/0/dim", "0",
         "field \"sharded[0].placements[0].dim\" has the wrong type (string): \"0\""},
    };
    for (const auto& [pointer, value, error] : cases) {
      nlohmann::json j = intact;
      j[nlohmann::json::json_pointer(pointer)] = value;
      std::ofstream(path, std::ios::trunc) << j.dump();
      EXPECT_EQ(error_of([&] { io::read_manifest(dir); }), invalid + error) << pointer;
    }
    std::ofstream(path, std::ios::trunc) << original;
    EXPECT_EQ(io::read_manifest(dir).sharded.size(), m.sharded.size());
  }

  // Version 1 still loads: the same checkpoint with its manifest as version 1 wrote it (each
  // rank's rows instead of a layout) resumes at world 2 as well.
  {
    const std::string path = dir + "/manifest.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    j["format_version"] = 1;
    for (auto& t : j["sharded"]) {
      const io::ShardedTensor* saved = nullptr;
      for (const io::ShardedTensor& s : m.sharded)
        if (s.name == t["name"]) saved = &s;
      ASSERT_NE(saved, nullptr) << t.dump();
      nlohmann::json rows = nlohmann::json::array();
      int64_t end = 0;
      for (int64_t q = 0; q < 3; ++q) {
        const auto held = layout::held(saved->layout, {q}).dims[0];
        const int64_t begin = held.empty() ? end : held[0].begin;
        end = held.empty() ? end : held[0].end;
        rows.push_back({begin, end});
      }
      t["rows"] = rows;
      t.erase("mesh");
      t.erase("placements");
    }
    std::ofstream(path) << j.dump(2);
    EXPECT_EQ(io::read_manifest(dir).format_version, 1);
    result = run_workers(sharded_checkpoint_train, 2, c);
    ASSERT_TRUE(result.ok()) << "version 1: " << result.describe();
  }

  // Python reads the torch.save export as a plain dict equal to the oracle.
  DDP_REQUIRE_PYTORCH(python_has_torch(), "/usr/bin/python3 has no torch (python3-torch)");
  const std::string script = exported.file("check.py");
  std::ofstream(script) << "import torch\n"
                           "got = torch.load('"
                        << exported.file("export.pt") << "')\nwant = torch.load('"
                        << exported.file("oracle.pt") << R"(')
assert type(got) is dict and sorted(got) == sorted(want), sorted(got)
for k in want:
    assert got[k].shape == want[k].shape, k
    err = ((got[k] - want[k]).norm() / want[k].norm()).item()
    assert err < 1e-5, (k, err)
print('torch.load ok', sorted(got))
)";
  const auto [out, code] = run_command("/usr/bin/python3 " + script);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("torch.load ok ['0.bias', '0.weight', '2.bias', '2.weight', '3.bias', "
                     "'3.weight']"),
            std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedCheckpointResume,
                         ::testing::Values(Case{"sgd", "fully_shard"}, Case{"adam", "fully_shard"},
                                           Case{"sgd", "default"}),
                         [](const auto& info) {
                           return info.param.optimizer + "_" + info.param.style;
                         });

// Local parameters and optimizer state of this rank, cloned: a refused load must leave them.
io::TensorMap snapshot(torch::nn::Module& net, torch::optim::Optimizer& opt) {
  io::TensorMap out;
  for (const auto& [k, t] : io::model_tensors(net)) out[k] = t.clone();
  for (const auto& [k, t] : io::optimizer_tensors(opt, net)) out["optim." + k] = t.clone();
  return out;
}

void require_unchanged(const io::TensorMap& before, torch::nn::Module& net,
                       torch::optim::Optimizer& opt, const std::string& context) {
  const io::TensorMap after = snapshot(net, opt);
  require(after.size() == before.size(), context + ": the state changed its keys");
  for (const auto& [k, t] : before)
    require(at::equal(after.at(k), t), context + ": '" + k + "' changed");
}

struct RefusalCase {
  std::string root;         // the checkpoint root
  std::string corrupt_dir;  // a copy of the checkpoint with one model shard file corrupted
  int corrupt = 0;          // the rank whose model shard file is corrupted
  std::string failing;      // the ranks that read that file, e.g. "0,1"
  DDP_CASE_FIELDS(root, corrupt_dir, corrupt, failing)
};

// Refusals at world 2 or 3 of the world-3 checkpoint in c.root (SGD, fully_shard): another
// model's checkpoint names the parameter and the file; a copy with rank c.corrupt's model file
// corrupted is refused naming that file by the ranks in c.failing, and loads on the others (which
// never read it).
DDP_TEST_WORKER_WITH(sharded_checkpoint_refusals, RefusalCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const std::string dir = io::checkpoint_dir(c.root, kSteps);
  const auto load = [&](torch::nn::Sequential net,
                        shard::FullyShardedDataParallel<torch::nn::Sequential>& model,
                        const std::string& from) {
    auto opt = make_test_optimizer("sgd", net->parameters());
    // One step, so that the optimizer has state that a refused load must keep.
    model(torch::ones({1, 5})).sum().backward();
    opt->step();
    const io::TensorMap before = snapshot(*net, *opt);
    io::TrainingState state = training_state(net.ptr().get(), opt.get(), model.sharding());
    const std::string error = error_of([&] { io::load_checkpoint(from, w, state, r); });
    if (!error.empty()) require_unchanged(before, *net, *opt, error);
    return error;
  };

  auto wider = make_net(8);
  shard::FullyShardedDataParallel<torch::nn::Sequential> wider_model(wider, pg);
  std::string error = load(wider, wider_model, dir);
  require(error == "ddp: checkpoint " + dir +
                       "/manifest.json: parameter '0.weight' has shape [7, 5] but the model's "
                       "has shape [8, 5]: was it saved from another model?",
          "another shape: " + error);

  auto deeper = make_net(7, /*extra_layer=*/true);
  shard::FullyShardedDataParallel<torch::nn::Sequential> deeper_model(deeper, pg);
  error = load(deeper, deeper_model, dir);
  require(error == "ddp: checkpoint " + dir +
                       " has no parameter '4.weight' that the model has (neither in "
                       "model.safetensors nor sharded in manifest.json): was it saved from "
                       "another model?",
          "another layer: " + error);

  const std::string& corrupt = c.corrupt_dir;
  const bool fails = c.failing.find(std::to_string(r)) != std::string::npos;
  auto same = make_net();
  shard::FullyShardedDataParallel<torch::nn::Sequential> same_model(same, pg);
  error = load(same, same_model, corrupt);
  const std::string file = corrupt + "/" + io::model_shard_file(c.corrupt);
  if (fails) {
    require(error.rfind("ddp: checkpoint " + file + " is corrupt: sha256 ", 0) == 0,
            "corrupt shard: " + error);
  } else {
    require(error.empty(), "a rank that does not read " + file + " failed: " + error);
  }
  pg->barrier("refusals done");
}

// A copy of `dir` with one byte of `file` changed (size kept: only the checksum can tell).
void corrupt_copy(const std::string& dir, const std::string& copy, const std::string& file) {
  fs::copy(dir, copy, fs::copy_options::recursive);
  std::fstream f(copy + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-1, std::ios::end);
  f.put('\x55');
}

TEST(ShardedCheckpointLoad, RefusesAnotherModelAndACorruptShardByNameAndLoadsIntoAPlainModel) {
  TempDir root("sharded_refusals");
  Case train{"sgd", "fully_shard"};
  train.root = root.str();
  const auto saved = run_workers(sharded_checkpoint_train, 3, train);
  ASSERT_TRUE(saved.ok()) << saved.describe();
  const std::string dir = io::checkpoint_dir(root.str(), kSteps);
  // At world 2 both ranks need rows that old rank 1 wrote; at world 3 only rank 2 reads rank 2's.
  corrupt_copy(dir, root.file("corrupt1"), io::model_shard_file(1));
  corrupt_copy(dir, root.file("corrupt2"), io::model_shard_file(2));
  auto result = run_workers(sharded_checkpoint_refusals, 2,
                            RefusalCase{root.str(), root.file("corrupt1"), 1, "0,1"});
  EXPECT_TRUE(result.ok()) << result.describe();
  result = run_workers(sharded_checkpoint_refusals, 3,
                       RefusalCase{root.str(), root.file("corrupt2"), 2, "2"});
  EXPECT_TRUE(result.ok()) << result.describe();

  // A plain single-process model (no shard plan) wants every row: it reads all three shards and
  // holds the parameters of step kSteps, as the single-process run has them.
  auto plain = make_net();
  auto opt = make_test_optimizer("sgd", plain->parameters());
  io::TrainingState state = training_state(plain.ptr().get(), opt.get());
  io::load_checkpoint(dir, 1, state);
  EXPECT_EQ(state.step, kSteps);
  EXPECT_EQ(io::optimizer_tensors(*opt, *plain).size(), 6u) << "a momentum buffer per parameter";
  require_close_maps(io::model_tensors(*plain), oracle("sgd", kSteps), "plain model");
}

}  // namespace
}  // namespace ddp::testing
