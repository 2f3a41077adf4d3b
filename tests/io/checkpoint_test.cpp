#include "ddp/io/checkpoint.hpp"
#include "ddp/io/checkpoint_manifest.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include "ddp/files/posix_file.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/sha256.hpp"
#include "ddp/models/registry.hpp"
#include "support/error_text.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace {

using ddp::testing::error_of;
using ddp::testing::TempDir;

namespace fs = std::filesystem;
using ddp::io::CheckpointOptions;
using ddp::io::TensorMap;
using ddp::io::TrainingState;

// A small model with buffers (BatchNorm running statistics), its optimizer and its data.
struct Trainer {
  ddp::models::Workload w;
  std::unique_ptr<torch::optim::Optimizer> opt;
  int64_t batch = 8;

  explicit Trainer(const std::string& optimizer, const std::string& model = "batchnorm")
      : w(ddp::testing::make_test_workload(model)) {
    if (optimizer == "adam") {
      opt = std::make_unique<torch::optim::Adam>(w.ptr->parameters(),
                                                 torch::optim::AdamOptions(0.01));
    } else if (optimizer == "adamw") {
      // The GPT recipe's two groups: weight decay on 2-D parameters only.
      std::vector<torch::Tensor> decayed, plain;
      for (const auto& p : w.ptr->parameters()) (p.dim() >= 2 ? decayed : plain).push_back(p);
      const auto options = torch::optim::AdamWOptions(0.01).amsgrad(true);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(
                                       torch::optim::AdamWOptions(options).weight_decay(0.1)));
      groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(
                                     torch::optim::AdamWOptions(options).weight_decay(0)));
      opt = std::make_unique<torch::optim::AdamW>(std::move(groups), options);
    } else if (optimizer == "rmsprop") {  // every optional field: momentum and centered
      opt = std::make_unique<torch::optim::RMSprop>(
          w.ptr->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.9).centered(true));
    } else if (optimizer == "adagrad") {
      opt = std::make_unique<torch::optim::Adagrad>(w.ptr->parameters(),
                                                    torch::optim::AdagradOptions(0.05));
    } else {
      opt = std::make_unique<torch::optim::SGD>(w.ptr->parameters(),
                                                torch::optim::SGDOptions(0.05).momentum(0.9));
    }
  }
  // Step `step` (1-based) on its own samples, as ddp-train picks them.
  void train(int from, int to) {
    for (int step = from; step <= to; ++step) {
      auto [x, y] = w.batch((step - 1) * batch, batch);
      opt->zero_grad();
      w.loss(w.module.forward(x), y).backward();
      opt->step();
    }
  }
  TrainingState state(int64_t step = 0) {
    TrainingState s;
    s.model = w.ptr.get();
    s.optimizer = opt.get();
    s.step = step;
    s.data_position = step * batch;
    return s;
  }
  // Every parameter perturbed: a loaded checkpoint must overwrite all of them.
  void perturb() {
    torch::NoGradGuard no_grad;
    for (auto& p : w.ptr->parameters()) p.add_(1.0);
    for (auto& b : w.ptr->buffers())
      if (at::isFloatingType(b.scalar_type())) b.add_(1.0);
  }
};

TensorMap cloned(const TensorMap& m) {
  TensorMap out;
  for (const auto& [k, v] : m) out[k] = v.clone();
  return out;
}

void expect_equal_maps(const TensorMap& got, const TensorMap& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.count(name), 1u) << what << ": " << name << " missing";
    EXPECT_TRUE(at::equal(got.at(name), t)) << what << ": " << name << " differs";
  }
}

std::vector<int64_t> steps_in(const std::string& root) {
  std::vector<int64_t> out;
  for (const auto& e : ddp::io::list_checkpoints(root)) out.push_back(e.step);
  return out;
}

TEST(CheckpointSha256, MatchesTheStandardDigests) {
  // FIPS 180-4 examples, plus the empty string and a million 'a's (two padding paths, many blocks).
  EXPECT_EQ(ddp::io::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ddp::io::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ddp::io::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(ddp::io::sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  TempDir dir;
  const std::string path = (dir.path / "f").string();
  std::string bytes(3 << 20, '\0');  // several read chunks
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + i / 1000);
  ddp::files::write_file_atomic(path, bytes);
  EXPECT_EQ(ddp::io::sha256_file(path), ddp::io::sha256_hex(bytes));
  if (::access("/usr/bin/sha256sum", X_OK) == 0) {
    const auto [out, code] = ddp::testing::run_command("/usr/bin/sha256sum " + path);
    ASSERT_EQ(code, 0) << out;
    EXPECT_EQ(out.substr(0, 64), ddp::io::sha256_hex(bytes));
  }
}

class CheckpointRoundTrip : public ::testing::TestWithParam<std::string> {};

// Save, then load into fresh objects: parameters, buffers, optimizer state, step, data position
// and the random generator come back, and two more steps from there match two more steps of the
// original bit for bit.
TEST_P(CheckpointRoundTrip, RestoresEverything) {
  TempDir root;
  Trainer a(GetParam());
  a.train(1, 3);
  CheckpointOptions options;
  options.root = root.str();
  const std::string dir = ddp::io::save_checkpoint(options, a.state(3));
  EXPECT_EQ(dir, (root.path / "step-3").string());
  for (const char* f :
       {"model.safetensors", "optim.safetensors", "rng.safetensors", "manifest.json"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  const at::Tensor drawn_after_save = at::rand({5});
  const TensorMap model_at_3 = cloned(ddp::io::model_tensors(*a.w.ptr));
  const TensorMap optim_at_3 = cloned(ddp::io::optimizer_tensors(*a.opt, *a.w.ptr));
  // Per parameter, PyTorch's state_dict fields: SGD momentum_buffer; Adam step, exp_avg,
  // exp_avg_sq; AdamW (AMSGrad, two parameter groups) also max_exp_avg_sq; RMSprop (momentum,
  // centered) step, square_avg, momentum_buffer, grad_avg; Adagrad step, sum.
  const std::map<std::string, size_t> fields{
      {"sgd", 1}, {"adam", 3}, {"adamw", 4}, {"rmsprop", 4}, {"adagrad", 2}};
  const size_t params = a.w.ptr->parameters().size();
  EXPECT_EQ(optim_at_3.size(), fields.at(GetParam()) * params);
  EXPECT_FALSE(a.w.ptr->buffers().empty());
  a.train(4, 5);

  Trainer b(GetParam());
  b.perturb();
  TrainingState state = b.state();
  const ddp::io::Manifest m = ddp::io::load_checkpoint(dir, 1, state);
  EXPECT_EQ(state.step, 3);
  EXPECT_EQ(state.data_position, 3 * b.batch);
  EXPECT_EQ(m.optimizer, GetParam());
  EXPECT_TRUE(at::equal(at::rand({5}), drawn_after_save));
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), model_at_3, "model");
  expect_equal_maps(ddp::io::optimizer_tensors(*b.opt, *b.w.ptr), optim_at_3, "optimizer");
  b.train(4, 5);
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), ddp::io::model_tensors(*a.w.ptr),
                    "after two more steps");
}

INSTANTIATE_TEST_SUITE_P(CheckpointOptimizers, CheckpointRoundTrip,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"),
                         [](const auto& info) { return info.param; });

// Any other optimizer is refused by name before anything is written.
TEST(Checkpoint, AnotherOptimizerIsRefusedByName) {
  TempDir root;
  Trainer a("sgd");
  a.opt = std::make_unique<torch::optim::LBFGS>(a.w.ptr->parameters());
  CheckpointOptions options;
  options.root = root.str();
  EXPECT_EQ(error_of([&] { ddp::io::save_checkpoint(options, a.state(1)); }),
            "ddp: checkpoint: only the state of torch::optim's SGD, Adam, AdamW, RMSprop and "
            "Adagrad can be saved; this optimizer is none of them");
  EXPECT_TRUE(fs::is_empty(root.path));
}

// A truncated file and a flipped byte are each refused with the file and the mismatch named; the
// refused load changes nothing; the older checkpoint is intact, and latest-valid falls back to it.
TEST(Checkpoint, CorruptCheckpointIsRefusedAndTheOlderOneIsIntact) {
  TempDir root;
  Trainer a("sgd");
  CheckpointOptions options;
  options.root = root.str();
  a.train(1, 1);
  const std::string older = ddp::io::save_checkpoint(options, a.state(1));
  const TensorMap model_at_1 = cloned(ddp::io::model_tensors(*a.w.ptr));
  a.train(2, 2);
  const std::string newer = ddp::io::save_checkpoint(options, a.state(2));

  Trainer b("sgd");
  const TensorMap before = cloned(ddp::io::model_tensors(*b.w.ptr));
  TrainingState state = b.state();

  // Truncated by one byte: the size says so, without hashing.
  const fs::path model = fs::path(newer) / "model.safetensors";
  const std::string model_bytes = ddp::testing::read_file(model.string());
  const uint64_t size = fs::file_size(model);
  fs::resize_file(model, size - 1);
  EXPECT_EQ(error_of([&] { ddp::io::load_checkpoint(newer, 1, state); }),
            "ddp: checkpoint " + model.string() + " is corrupt: " + std::to_string(size - 1) +
                " bytes != manifest " + std::to_string(size) + " bytes (truncated or overwritten)");

  // Same size, one byte flipped: the checksum says so.
  ddp::files::write_file_atomic(model.string(), model_bytes);  // intact again
  const fs::path optim = fs::path(newer) / "optim.safetensors";
  {
    std::fstream f(optim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = char(f.get());
    f.seekp(-3, std::ios::end);
    f.put(char(c ^ 0x10));
  }
  const std::string refused = error_of([&] { ddp::io::load_checkpoint(newer, 1, state); });
  const std::regex sha_message("ddp: checkpoint " + optim.string() +
                               " is corrupt: sha256 [0-9a-f]{64} != manifest [0-9a-f]{64}");
  EXPECT_TRUE(std::regex_match(refused, sha_message)) << refused;
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), before, "after refused loads");
  EXPECT_EQ(state.step, 0);

  // Latest-valid skips the corrupt one, saying why, and the older one loads.
  ::testing::internal::CaptureStderr();
  const auto latest = ddp::io::find_latest_checkpoint(root.str());
  const std::string warning = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 1);
  EXPECT_EQ(latest->dir, older);
  // Through obs/log at its default level: shown without DDP_LOG_LEVEL, under the rank's prefix.
  EXPECT_EQ(warning.rfind("[ddp rank 0] ddp: warning: skipping checkpoint " + newer +
                              ": checkpoint " + newer + "/optim.safetensors is corrupt: sha256 ",
                          0),
            0u)
      << warning;
  ddp::io::load_checkpoint(older, 1, state);
  EXPECT_EQ(state.step, 1);
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), model_at_1, "older checkpoint");
}

// A step directory without its manifest (a copy interrupted, a crash under another writer) is
// incomplete: refused by load, skipped by latest-valid.
TEST(Checkpoint, MissingManifestIsIncomplete) {
  TempDir root;
  Trainer a("adam");
  CheckpointOptions options;
  options.root = root.str();
  ddp::io::save_checkpoint(options, a.state(4));
  const std::string dir = ddp::io::save_checkpoint(options, a.state(8));
  fs::remove(fs::path(dir) / "manifest.json");
  TrainingState state = a.state();
  EXPECT_EQ(error_of([&] { ddp::io::load_checkpoint(dir, 1, state); }),
            "ddp: checkpoint " + dir +
                " is incomplete: manifest.json is missing (a checkpoint is complete only once its "
                "manifest is written)");
  ::testing::internal::CaptureStderr();
  const auto latest = ddp::io::find_latest_checkpoint(root.str());
  const std::string warning = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 4);
  EXPECT_NE(warning.find("skipping checkpoint " + dir + ": checkpoint " + dir + " is incomplete"),
            std::string::npos)
      << warning;
  EXPECT_FALSE(ddp::io::find_latest_checkpoint((root.path / "absent").string()).has_value());
}

// Every manifest field a resume needs is checked, named when wrong (issue 49: a FULLY_SHARD
// manifest fuzzed with "rng.cpu" set to 0 or [] loaded as if valid). One checkpoint per case, its
// manifest.json changed in one place: load refuses with the exact text, and the newest-valid
// search falls back to the intact older checkpoint.
TEST(Checkpoint, EveryManifestFieldTheResumeNeedsIsChecked) {
  using json = nlohmann::json;
  struct Case {
    const char* pointer;  // JSON pointer of the field; "" with `remove`: the field below
    json value;
    bool remove;
    std::string error;  // after "ddp: checkpoint manifest <path> is invalid: "
  };
  const std::vector<Case> cases = {
      {"/format", "other", false, "format is not \"ddp-checkpoint\""},
      {"/format_version", "2", false,
       "field \"format_version\" has the wrong type (string): \"2\""},
      {"/step", json::array(), false, "field \"step\" has the wrong type (array): []"},
      {"/step", nullptr, true, "field \"step\" is missing"},
      {"/data_position", nullptr, false, "field \"data_position\" has the wrong type (null): null"},
      {"/world_size", "x", false, "field \"world_size\" has the wrong type (string): \"x\""},
      {"/optimizer", 0, false, "field \"optimizer\" has the wrong type (number): 0"},
      {"/global_batch", "8", false, "field \"global_batch\" has the wrong type (string): \"8\""},
      {"/rng", 0, false, "field \"rng\" is not an object: 0"},
      {"/rng", nullptr, true, "field \"rng\" is missing"},
      {"/rng/cpu", 0, false, "field \"rng.cpu\" has the wrong type (number): 0"},
      {"/rng/cpu", json::array(), false, "field \"rng.cpu\" has the wrong type (array): []"},
      {"/rng/cpu", nullptr, true, "field \"rng.cpu\" is missing"},
      {"/rng/cpu", "model.safetensors", false,
       "field \"rng.cpu\" is \"model.safetensors\", expected \"rng.safetensors\""},
      {"/rng/cuda", 1, false, "field \"rng.cuda\" has the wrong type (number): 1"},
      {"/rng/cuda", "saved", false, "field \"rng.cuda\" is \"saved\", expected \"not saved\""},
      {"/files", json::object(), false, "\"files\" is not a list"},
      {"/files/0/bytes", "1", false, "field \"files[0].bytes\" has the wrong type (string): \"1\""},
      {"/files/1/sha256", 5, false, "field \"files[1].sha256\" has the wrong type (number): 5"},
      {"/files/0/name", "../x", false, "file name '../x' is not a plain file name"},
  };
  for (const Case& c : cases) {
    TempDir root;
    Trainer a("sgd");
    CheckpointOptions options;
    options.root = root.str();
    ddp::io::save_checkpoint(options, a.state(4));
    const std::string dir = ddp::io::save_checkpoint(options, a.state(8));
    const std::string path = (fs::path(dir) / "manifest.json").string();
    json j = json::parse(std::ifstream(path));
    const json::json_pointer at(c.pointer);
    if (c.remove) {
      j.at(at.parent_pointer()).erase(at.back());
    } else {
      j[at] = c.value;
    }
    std::ofstream(path, std::ios::trunc) << j.dump();
    TrainingState state = a.state();
    EXPECT_EQ(error_of([&] { ddp::io::load_checkpoint(dir, 1, state); }),
              "ddp: checkpoint manifest " + path + " is invalid: " + c.error)
        << c.pointer;
    ::testing::internal::CaptureStderr();
    const auto latest = ddp::io::find_latest_checkpoint(root.str());
    ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(latest.has_value()) << c.pointer;
    EXPECT_EQ(latest->step, 4) << c.pointer << ": the intact older checkpoint";
  }
}

// keep=K deletes only older checkpoints, only after the new one is complete; a higher step (from a
// run that went further before a resume), other files and a live writer's temp dir are left alone;
// a dead writer's temp dir is removed.
TEST(Checkpoint, KeepsTheLastKAndDeletesOnlyOlderOnes) {
  TempDir root;
  Trainer a("sgd");
  CheckpointOptions options;
  options.root = root.str();
  options.keep = 2;
  fs::create_directories(root.path / "notes");
  fs::create_directories(root.path / ".tmp-step-7-999999999");  // no such pid
  const std::string live = ".tmp-step-7-" + std::to_string(::getppid());
  fs::create_directories(root.path / live);
  for (int step = 1; step <= 5; ++step) {
    ddp::io::save_checkpoint(options, a.state(step));
    EXPECT_EQ(steps_in(root.str()).size(), size_t(std::min(step, 2))) << "after step " << step;
  }
  EXPECT_EQ(steps_in(root.str()), (std::vector<int64_t>{5, 4}));
  EXPECT_TRUE(fs::exists(root.path / "notes"));
  EXPECT_TRUE(fs::exists(root.path / live));
  EXPECT_FALSE(fs::exists(root.path / ".tmp-step-7-999999999"));

  ddp::io::save_checkpoint(options, a.state(9));
  options.keep = 1;
  ddp::io::save_checkpoint(options, a.state(6));  // 9 is not older than 6: kept
  EXPECT_EQ(steps_in(root.str()), (std::vector<int64_t>{9, 6}));
  options.keep = 0;  // all
  for (int step = 10; step <= 13; ++step) ddp::io::save_checkpoint(options, a.state(step));
  EXPECT_EQ(steps_in(root.str()), (std::vector<int64_t>{13, 12, 11, 10, 9, 6}));
}

// Saving a step that exists replaces it whole (an earlier attempt at the same step).
TEST(Checkpoint, SavingAnExistingStepReplacesIt) {
  TempDir root;
  Trainer a("sgd");
  CheckpointOptions options;
  options.root = root.str();
  ddp::io::save_checkpoint(options, a.state(3));
  a.train(1, 2);
  const TensorMap trained = cloned(ddp::io::model_tensors(*a.w.ptr));
  const std::string dir = ddp::io::save_checkpoint(options, a.state(3));
  Trainer b("sgd");
  TrainingState state = b.state();
  ddp::io::load_checkpoint(dir, 1, state);
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), trained, "replaced checkpoint");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root.path)) entries += e.exists() ? 1 : 0;
  EXPECT_EQ(entries, 1);  // no temporary left behind
}

// As PyTorch loads a DDP state dict anywhere: saved at world 2, loaded at world 3.
TEST(Checkpoint, ReplicatedCheckpointLoadsAtAnotherWorldSize) {
  TempDir root;
  Trainer a("sgd");
  a.train(1, 2);
  CheckpointOptions options;
  options.root = root.str();
  options.world_size = 2;
  const std::string dir = ddp::io::save_checkpoint(options, a.state(5));
  Trainer b("sgd");
  TrainingState state = b.state();
  ddp::io::load_checkpoint(dir, 3, state);
  expect_equal_maps(ddp::io::model_tensors(*b.w.ptr), ddp::io::model_tensors(*a.w.ptr),
                    "loaded at world 3");
  EXPECT_EQ(state.step, 5);
}

TEST(Checkpoint, OtherOptimizerOrModelIsRefused) {
  TempDir root;
  Trainer a("sgd");
  a.train(1, 1);
  CheckpointOptions options;
  options.root = root.str();
  const std::string dir = ddp::io::save_checkpoint(options, a.state(1));
  Trainer adam("adam");
  TrainingState state = adam.state();
  EXPECT_EQ(
      error_of([&] { ddp::io::load_checkpoint(dir, 1, state); }),
      "ddp: checkpoint " + dir + " holds the state of a sgd optimizer but this run uses adam");
  Trainer mlp("sgd", "mlp");
  state = mlp.state();
  EXPECT_NE(error_of([&] { ddp::io::load_checkpoint(dir, 1, state); }).find("that the model has ("),
            std::string::npos);
}

TEST(Checkpoint, OnlyRankZeroWrites) {
  TempDir root;
  Trainer a("sgd");
  CheckpointOptions options;
  options.root = (root.path / "ckpt").string();
  options.rank = 1;
  EXPECT_EQ(ddp::io::save_checkpoint(options, a.state(2)), "");
  EXPECT_FALSE(fs::exists(options.root));
}

struct LoadCase {
  std::string root;  // the checkpoint root
  DDP_CASE_FIELDS(root)
};

// Rank 0 writes, a barrier, every rank loads into a model it perturbed: all end with rank 0's
// trained state, bit for bit.
DDP_TEST_WORKER_WITH(checkpoint_every_rank_loads, LoadCase, c) {
  auto pg = ddp::testing::worker_process_group();
  const std::string& root = c.root;
  Trainer a("adam", "mlp");
  a.train(1, 2);
  CheckpointOptions options;
  options.root = root;
  options.rank = pg->rank();
  options.world_size = pg->world_size();
  const std::string dir = ddp::io::save_checkpoint(options, a.state(2));
  ddp::testing::require((pg->rank() == 0) == !dir.empty(), "only rank 0 returns a directory");
  pg->barrier("checkpoint written");
  Trainer b("adam", "mlp");
  b.perturb();
  TrainingState state = b.state();
  ddp::io::load_checkpoint(ddp::io::checkpoint_dir(root, 2), pg->world_size(), state);
  ddp::testing::require(state.step == 2, "step restored");
  for (const auto& [name, t] : ddp::io::model_tensors(*a.w.ptr))
    ddp::testing::require(at::equal(ddp::io::model_tensors(*b.w.ptr).at(name), t),
                          "parameter " + name + " differs after load");
  // Every rank holds the same values: compare a sum of all parameters across ranks.
  at::Tensor sum = at::zeros({1}, at::kDouble);
  for (const auto& p : b.w.ptr->parameters()) sum += p.to(at::kDouble).sum();
  const auto all = pg->all_gather_each(sum, "parameter sums");
  for (const auto& s : all)
    ddp::testing::require(at::equal(s, all[0]), "ranks disagree after loading");
}

class CheckpointWorld : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointWorld, RankZeroWritesEveryRankLoads) {
  TempDir root;
  const auto result = ddp::testing::run_workers(
      checkpoint_every_rank_loads, GetParam(), LoadCase{root.str()}, {}, std::chrono::seconds(120));
  ASSERT_TRUE(result.ok()) << result.describe();
  EXPECT_EQ(steps_in(root.str()), (std::vector<int64_t>{2}));
}

INSTANTIATE_TEST_SUITE_P(CheckpointSizes, CheckpointWorld, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
