// Checkpoints written in the background (io/async_checkpointer.hpp) on Gloo at worlds 1, 2 and 3,
// replicated (rank 0 writes) and FULLY_SHARD (every rank its shard): the files equal, byte for
// byte, those save_and_barrier writes of the same state although training changed the live
// tensors while they were written; a second save waits for the first; a resume loads what was
// saved; a rank whose write fails (RLIMIT_FSIZE: a full disk) is reported by poll() on that rank
// and by the next save on every rank, with the older checkpoint intact and nothing left behind.

#include "ddp/io/async_checkpointer.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <tuple>

#include "ddp/io/checkpoint_manifest.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 6;  // divides world 1, 2 and 3

torch::nn::Sequential make_net() {
  // dim 0: 7, uneven at world 2 and 3.
  return torch::nn::Sequential(torch::nn::Linear(5, 7), torch::nn::ReLU(), torch::nn::Linear(7, 2));
}

// One rank's run: the model (sharded or whole), its optimizer, and the state a checkpoint takes.
struct Run {
  comm::ProcessGroupPtr pg = worker_process_group(std::chrono::seconds(60));
  torch::nn::Sequential net;
  std::unique_ptr<shard::FullyShardedDataParallel<torch::nn::Sequential>> sharded;
  std::unique_ptr<torch::optim::SGD> opt;
  io::TrainingState state;

  explicit Run(bool fully_shard) {
    torch::manual_seed(0);
    net = make_net();
    if (fully_shard) {
      shard::ShardOptions options;
      options.style = shard::parse_style("fully_shard");
      sharded = std::make_unique<shard::FullyShardedDataParallel<torch::nn::Sequential>>(net, pg,
                                                                                         options);
    }
    opt = std::make_unique<torch::optim::SGD>(net->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
    state.model = net.ptr().get();
    state.optimizer = opt.get();
    state.global_batch = kGlobalBatch;
    if (sharded) state.sharding = sharded->sharding();
  }

  // One step on this rank's part of a global batch drawn from `step`; every parameter and
  // momentum buffer changes.
  void step(int64_t step) {
    torch::manual_seed(1000 + step);
    const torch::Tensor x = torch::randn({kGlobalBatch, 5}), y = torch::randn({kGlobalBatch, 2});
    const int64_t per_rank = kGlobalBatch / pg->world_size(), first = pg->rank() * per_rank;
    const torch::Tensor out = sharded ? (*sharded)(x.narrow(0, first, per_rank))
                                      : net->forward(x.narrow(0, first, per_rank));
    torch::mse_loss(out, y.narrow(0, first, per_rank)).backward();
    if (!sharded) {
      // Replicated: every rank the same gradient (the whole batch's mean), as DDP would give.
      for (auto& p : net->parameters()) {
        p.mutable_grad().div_(pg->world_size());
        pg->allreduce_sum(p.mutable_grad(), "test gradient");
      }
    }
    opt->step();
    opt->zero_grad();
    state.step = step;
    state.data_position = step * kGlobalBatch;
  }
};

io::AsyncCheckpointerOptions async_options(const std::string& root) {
  io::AsyncCheckpointerOptions options;
  options.coordinator.root = root;
  options.coordinator.keep = 0;
  return options;
}

// "name@rank bytes sha256" of every file, in the manifest's order.
std::string files_of(const io::Manifest& m) {
  std::string out;
  for (const io::ManifestFile& f : m.files) {
    out += f.name + "@" + std::to_string(f.rank) + " " + std::to_string(f.bytes) + " " + f.sha256 +
           "\n";
  }
  return out;
}

// The landed save, polled: no sleep, each poll a training step of its own.
io::AsyncSaveEnd poll_until_landed(io::AsyncCheckpointer& saver) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    if (auto end = saver.poll()) return *end;
    require(std::chrono::steady_clock::now() < deadline, "the background save never landed");
    std::this_thread::yield();
  }
}

// Both workers' parameters; style and sync_root are async_checkpoint_equals_sync's only.
struct Case {
  std::string async_root;           // where the AsyncCheckpointer writes
  std::string style = "replicate";  // or "fully_shard"
  std::string sync_root{};          // where save_and_barrier writes
  DDP_CASE_FIELDS(async_root, style, sync_root)
};

DDP_TEST_WORKER_WITH(async_checkpoint_equals_sync, Case, c) {
  Run run(c.style == "fully_shard");
  const int rank = run.pg->rank();
  const std::string sync_root = c.sync_root, async_root = c.async_root;
  io::CoordinatorOptions sync;
  sync.root = sync_root;
  sync.keep = 0;
  io::AsyncCheckpointer saver(*run.pg, async_options(async_root));

  run.step(1);
  run.step(2);
  const std::string sync_dir = io::save_and_barrier(*run.pg, sync, run.state);
  const io::AsyncSaveStart started = saver.save(run.state);
  require(started.step == 2 && started.waited_s == 0 && started.blocked_s > 0,
          "the first save's start: step " + std::to_string(started.step) + ", waited " +
              std::to_string(started.waited_s));
  require(saver.in_flight(), "no save in flight after save()");
  // Training goes on while the writer writes: what it writes is step 2's state all the same.
  run.step(3);
  const std::string dir = saver.wait();
  require(dir == (rank == 0 ? io::checkpoint_dir(async_root, 2) : ""), "wait() returned " + dir);
  require(!saver.in_flight() && !saver.poll(), "a save still in flight after wait()");
  if (rank == 0) {
    const io::Manifest want = io::verify_checkpoint(sync_dir);
    const io::Manifest got = io::verify_checkpoint(io::checkpoint_dir(async_root, 2));
    require(files_of(got) == files_of(want),
            "async files:\n" + files_of(got) + "sync files:\n" + files_of(want));
    require(got.step == 2 && got.data_position == 2 * kGlobalBatch &&
                got.global_batch == kGlobalBatch && got.optimizer == "sgd" &&
                got.world_size == run.pg->world_size() && got.sharded.size() == want.sharded.size(),
            "the async manifest differs from the sync one");
  }

  // A second save while the first is in flight waits for it, then starts its own.
  saver.save(run.state);  // step 3
  run.step(4);
  const io::AsyncSaveStart second = saver.save(run.state);
  require(second.step == 4 && second.waited_s >= 0, "the second save's start");
  require(rank != 0 || fs::exists(fs::path(io::checkpoint_dir(async_root, 3)) / "manifest.json"),
          "step-3 not complete once step-4's save started");
  io::TensorMap at_step_4;
  for (const auto& [name, t] : io::model_tensors(*run.net)) at_step_4[name] = t.clone();
  run.step(5);
  const io::AsyncSaveEnd landed = poll_until_landed(saver);
  require(landed.step == 4 && landed.error.empty() &&
              landed.dir == (rank == 0 ? io::checkpoint_dir(async_root, 4) : ""),
          "poll: step " + std::to_string(landed.step) + " dir '" + landed.dir + "' error '" +
              landed.error + "'");
  require(!saver.poll(), "poll said the same save twice");
  require(saver.wait().empty(), "wait() names the save poll() said");

  // What was saved is what a resume loads: step 4's parameters, bit for bit.
  io::CoordinatorOptions resume;
  resume.root = async_root;
  const auto entry = io::resume_latest(*run.pg, resume, run.state);
  require(entry && entry->step == 4 && run.state.step == 4, "did not resume from step 4");
  for (const auto& [name, t] : io::model_tensors(*run.net)) {
    require(torch::equal(t, at_step_4.at(name)), "resumed '" + name + "' differs from step 4's");
  }
}

class AsyncCheckpoint : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AsyncCheckpoint, WritesWhatTheSyncSaveWritesWhileTrainingGoesOn) {
  const auto& [style, world] = GetParam();
  TempDir sync_root("async_sync"), async_root("async_async");
  const auto result = run_workers(async_checkpoint_equals_sync, world,
                                  Case{async_root.str(), style, sync_root.str()});
  ASSERT_TRUE(result.ok()) << result.describe();
  // Nothing left behind: the published steps and no temporary directory.
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(async_root.path))
    names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step-2", "step-3", "step-4"}));
}

// The last rank cannot write more than a few bytes (a full disk, as far as its writes go).
DDP_TEST_WORKER_WITH(async_checkpoint_failure, Case, c) {
  Run run(true);
  const int rank = run.pg->rank(), world = run.pg->world_size();
  const bool failing = rank == world - 1;
  const std::string root = c.async_root;
  io::AsyncCheckpointer saver(*run.pg, async_options(root));
  run.step(1);
  saver.save(run.state);
  saver.wait();  // step-1: the older checkpoint that must survive

  run.step(2);
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  if (failing) {
    ::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of ending the process
    rlimit tiny = saved;
    tiny.rlim_cur = 64;
    ::setrlimit(RLIMIT_FSIZE, &tiny);
  }
  saver.save(run.state);
  run.step(3);
  const io::AsyncSaveEnd end = poll_until_landed(saver);
  if (failing || rank == 0) {
    require(
        end.step == 2 && end.dir.empty() && end.error.find("File too large") != std::string::npos,
        "poll on rank " + std::to_string(rank) + ": '" + end.error + "'");
  } else {
    require(end.error.empty(), "poll on a healthy rank: '" + end.error + "'");
  }
  if (failing) ::setrlimit(RLIMIT_FSIZE, &saved);

  // The next save says so on every rank, and starts nothing.
  std::string error;
  try {
    saver.save(run.state);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const std::string prefix = "ddp: the background save of checkpoint step-2 failed: ";
  if (failing && rank != 0) {
    require(error.rfind(prefix + "writing '", 0) == 0 &&
                error.find("failed: File too large") != std::string::npos,
            "the failing rank's error: " + error);
  } else if (rank == 0) {
    const std::string own = world == 1 ? prefix + "writing '"
                                       : prefix + "rank " + std::to_string(world - 1) +
                                             " could not write its files: writing '";
    require(error.rfind(own, 0) == 0 && error.find("File too large") != std::string::npos,
            "rank 0's error: " + error);
  } else {
    require(error ==
                "ddp: the background save of the last checkpoint failed on 2 rank(s) (their "
                "errors say why)",
            "a healthy rank's error: " + error);
  }
  require(!saver.in_flight(), "a failed agreement started a save");
  // Caught, the next save goes through.
  saver.save(run.state);
  require(!saver.wait().empty() || rank != 0, "the save after the failure");
}

class AsyncCheckpointFailure : public ::testing::TestWithParam<int> {};

TEST_P(AsyncCheckpointFailure, AFailedWriteIsSaidByNameAndLosesNothingOlder) {
  const int world = GetParam();
  TempDir root("async_fail");
  const auto result = run_workers(async_checkpoint_failure, world, Case{root.str()});
  ASSERT_TRUE(result.ok()) << result.describe();
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(root.path))
    names.insert(e.path().filename().string());
  // step-2 never published, its temporary directory removed; step-3 saved after the failure.
  EXPECT_EQ(names, (std::set<std::string>{"step-1", "step-3"}));
  EXPECT_EQ(io::verify_checkpoint(io::checkpoint_dir(root.str(), 1)).step, 1);
}

INSTANTIATE_TEST_SUITE_P(StylesWorlds, AsyncCheckpoint,
                         ::testing::Combine(::testing::Values("replicate", "fully_shard"),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_world" +
                                  std::to_string(std::get<1>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(Worlds, AsyncCheckpointFailure, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace ddp::testing
