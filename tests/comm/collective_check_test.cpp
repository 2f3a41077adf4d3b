// The collective check (comm/recorder/collective_check.hpp) and the desyncs it is for, on Gloo at
// worlds 2 and 3:
//   - the check alone, over one in-memory store: ranks that agree for 3000 collectives (the store
//     slots reused twice over), the sentence for the first that differs, a slot lost from the
//     store;
//   - a rank that skips one bucket's all-reduce (a comm hook of the test's): without the check
//     nothing hangs at once, the bucket after it is summed with the skipped one on the other
//     ranks, and ddp-forensics names the bucket that differs; with the check, the rank that comes
//     second to that collective stops before issuing it, and every rank's error names it;
//   - a rank whose model has one parameter more, averaging its gradients by hand: stopped by the
//     check at collective #1, before the all-reduce of two different tensors.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "ddp/comm/recorder/collective_check.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/param_names.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

const std::string kFloats16 = "all-reduce (sum) of 16 Float elements for the user's own call";
const std::string kFloats3 = "all-reduce (sum) of 3 Float elements for the user's own call";

TEST(CollectiveCheck, RanksThatAgreePassAndTheStoreSlotsAreReused) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::CollectiveCheck rank0(store, 0, "ddp/world");
  comm::CollectiveCheck rank1(store, 1, "ddp/world");
  // Either rank may come first: alternate, so each claims slots from the other's older values.
  for (int64_t seq = 1; seq <= 3000; ++seq) {
    auto& first = seq % 2 == 0 ? rank0 : rank1;
    auto& second = seq % 2 == 0 ? rank1 : rank0;
    const std::string fp = "all-reduce (sum) of " + std::to_string(seq) + " Float elements";
    ASSERT_EQ(first.before(seq, fp), "") << seq;
    ASSERT_EQ(second.before(seq, fp), "") << seq;
  }
  EXPECT_FALSE(store->check({comm::CollectiveCheck::differs_key()}));
}

TEST(CollectiveCheck, TheFirstCollectiveThatDiffersIsNamedAndPublished) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::CollectiveCheck rank0(store, 0, "ddp/world");
  comm::CollectiveCheck rank2(store, 2, "ddp/world");
  ASSERT_EQ(rank0.before(1, kFloats16), "");
  ASSERT_EQ(rank2.before(1, kFloats16), "");
  ASSERT_EQ(rank2.before(2, kFloats3), "");  // rank 2 first this time
  const std::string expected =
      "collective #2 of group ddp/world differs across ranks: rank 2 "
      "issued " +
      kFloats3 + "; rank 0 was about to issue " + kFloats16;
  EXPECT_EQ(rank0.before(2, kFloats16), expected);
  const auto published = store->get(comm::CollectiveCheck::differs_key());
  EXPECT_EQ(std::string(published.begin(), published.end()), expected);
  // A later difference does not replace the first.
  ASSERT_EQ(rank2.before(3, kFloats3), "");
  EXPECT_NE(rank0.before(3, kFloats16), "");
  const auto kept = store->get(comm::CollectiveCheck::differs_key());
  EXPECT_EQ(std::string(kept.begin(), kept.end()), expected);
}

TEST(CollectiveCheck, ASlotGoneFromTheStoreIsClaimedAgain) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::CollectiveCheck rank0(store, 0, "ddp/world");
  comm::CollectiveCheck rank1(store, 1, "ddp/world");
  ASSERT_EQ(rank0.before(5, kFloats16), "");
  ASSERT_EQ(rank1.before(5, kFloats16), "");
  // The slot of #5 is #1029's: rank 0 expects its old value, which is gone.
  store->deleteKey("check/5");
  EXPECT_EQ(rank0.before(1029, kFloats3), "");
  EXPECT_EQ(rank1.before(1029, kFloats16),
            "collective #1029 of group ddp/world differs across ranks: rank 0 issued " + kFloats3 +
                "; rank 1 was about to issue " + kFloats16);
}

#ifdef DDP_FORENSICS_PATH  // the tool is built with the tools

// Sums each bucket with a blocking all-reduce, so that a failure is the group's (and dumps);
// with `skip`, bucket 1 is left alone: this rank's next all-reduce meets the others' bucket 1.
// Rank 0 writes `numbers` at bucket 0: "<bucket 1's collective number> <plan epoch>".
class SkippingHook : public hooks::CommHook {
 public:
  SkippingHook(comm::ProcessGroupPtr pg, bool skip, std::string numbers)
      : pg_(std::move(pg)), skip_(skip), numbers_(std::move(numbers)) {}
  c10::intrusive_ptr<c10::ivalue::Future> run(hooks::GradBucket& bucket) override {
    if (bucket.index == 0 && pg_->rank() == 0) {
      std::ofstream(numbers_) << pg_->collectives_issued() + 2 << " " << bucket.plan_epoch;
    }
    if (!(skip_ && bucket.index == 1)) {
      pg_->allreduce_sum(bucket.buffer, "bucket " + std::to_string(bucket.index));
    }
    return hooks::completed_future(bucket.buffer);
  }
  std::string name() const override { return "skipping"; }

 private:
  comm::ProcessGroupPtr pg_;
  bool skip_;
  std::string numbers_;
};

// One parameter more on `extra` ranks, registered first: its gradient is the first all-reduced.
struct Net : torch::nn::Module {
  explicit Net(bool extra) {
    if (extra) register_parameter("scale", torch::ones({3}));
    fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = fc(x);
    for (const auto& p : parameters(/*recurse=*/false)) y = y * p.sum();
    return y;
  }
  torch::nn::Linear fc{nullptr};
};

struct ScenarioCase {
  std::string scenario;  // skip_bucket or extra_parameter
  std::string dir;       // where the ranks write their errors (and rank 0 the numbers)
  DDP_CASE_FIELDS(scenario, dir)
};

// The last rank diverges (c.scenario); every rank writes what it ended with to
// c.dir/error-rank<R> ("" when nothing was raised), and rank 0 (the store's host) stays until
// every rank wrote, so that their errors can still read the store.
DDP_TEST_WORKER_WITH(desync_scenario, ScenarioCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(2));
  const std::string& scenario = c.scenario;
  const std::string& dir = c.dir;
  const bool odd = pg->rank() == pg->world_size() - 1;
  std::string error;
  try {
    if (scenario == "skip_bucket") {
      torch::nn::Sequential net;
      for (int i = 0; i < 3; ++i) {
        net->push_back(torch::nn::Linear(torch::nn::LinearOptions(8, 8).bias(false)));
      }
      parallel::DDPOptions options;
      // One 8x8 weight (256 bytes) per bucket: three buckets of equal size.
      options.gradients.buckets.first_bucket_cap_bytes = 256;
      options.gradients.buckets.bucket_cap_bytes = 256;
      parallel::DistributedDataParallel<torch::nn::Sequential> model(net, pg, options);
      model.register_comm_hook(std::make_shared<SkippingHook>(pg, odd, dir + "/numbers"));
      model(torch::randn({4, 8})).sum().backward();
      comm::dump_flight_recorder("test: after the backward");
    } else {
      Net net(odd);
      net.forward(torch::randn({2, 4})).sum().backward();
      for (const auto& p : net.parameters()) {
        torch::Tensor grad = p.grad();
        pg->allreduce_sum(grad, "a gradient's sum");
      }
      comm::dump_flight_recorder("test: after the gradients");
    }
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    error = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  }
  write_file(dir + "/error-rank" + std::to_string(pg->rank()), error);
  const std::string done = "test/done/" + std::to_string(pg->rank());
  pg->store().set(done, std::vector<uint8_t>{1});
  if (pg->rank() != 0) return;
  std::vector<std::string> all;
  for (int r = 0; r < pg->world_size(); ++r) all.push_back("test/done/" + std::to_string(r));
  pg->store().wait(all, std::chrono::seconds(60));
}

struct Outcome {
  std::string dir;                  // the dumps'
  std::vector<std::string> errors;  // by rank
  std::string forensics;            // ddp-forensics' first line
  int64_t bucket1 = 0;              // skip_bucket: bucket 1's collective number on rank 0
  int64_t epoch = 0;
};

Outcome run_scenario(const std::string& scenario, int world, bool check, const TempDir& dir) {
  const std::map<std::string, std::string> env{{"DDP_FLIGHT_RECORDER_DIR", dir.str()},
                                               {"DDP_CHECK_COLLECTIVES", check ? "1" : "0"}};
  EXPECT_WORKERS_PASS(run_workers(desync_scenario, world, ScenarioCase{scenario, dir.str()}, env,
                                  std::chrono::seconds(60)));
  Outcome out;
  out.dir = dir.str();
  for (int r = 0; r < world; ++r)
    out.errors.push_back(read_file(dir.file("error-rank" + std::to_string(r))));
  std::istringstream(read_file(dir.file("numbers"))) >> out.bucket1 >> out.epoch;
  const auto [text, code] =
      run_command(std::string(DDP_FORENSICS_PATH) + " " + dir.str() + " 2>&1");
  EXPECT_EQ(code, 0) << text;
  out.forensics = text.substr(0, text.find('\n'));
  return out;
}

std::string ranks_word(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// Checks what every rank ended with when the last rank's collective #seq (`odd_one`) differs
// from the others' (`usual`) and the check is on: the ranks that came second raised the check's
// error before issuing it; the others failed in #seq with the check's finding in their error;
// ddp-forensics names the ranks the check stopped.
void expect_stopped_by_the_check(const Outcome& out, int64_t seq, const std::string& usual,
                                 const std::string& odd_one) {
  const int world = static_cast<int>(out.errors.size());
  const int odd = world - 1;
  std::vector<int> raised, waited;
  for (int r = 0; r < world; ++r) {
    (out.errors[static_cast<size_t>(r)].rfind("ddp: collective #", 0) == 0 ? raised : waited)
        .push_back(r);
  }
  ASSERT_FALSE(raised.empty()) << out.errors[0];
  ASSERT_FALSE(waited.empty()) << out.errors[0];
  // Either the odd rank came second (it alone raised) or first (every other rank raised).
  const bool odd_raised = raised == std::vector<int>{odd};
  ASSERT_TRUE(odd_raised || waited == std::vector<int>{odd}) << ranks_word(raised);
  // The sentence of a raising rank `r` names the rank that came first, one of `waited`.
  auto sentence = [&](int first, int r) {
    return "collective #" + std::to_string(seq) +
           " of group ddp/world differs across ranks: rank " + std::to_string(first) + " issued " +
           (first == odd ? odd_one : usual) + "; rank " + std::to_string(r) +
           " was about to issue " + (r == odd ? odd_one : usual);
  };
  std::set<std::string> published;  // what any raising rank may have published first
  for (int r : raised) {
    const std::string& error = out.errors[static_cast<size_t>(r)];
    bool matched = false;
    for (int first : waited) {
      const std::string s = sentence(first, r);
      published.insert(s);
      matched |= error == "ddp: " + s +
                              " (found by the collective check before this rank issued it; every "
                              "rank must issue the same collectives in the same order; flight "
                              "recorder dump: " +
                              out.dir + "/flight-rank" + std::to_string(r) + ".json)";
    }
    EXPECT_TRUE(matched) << "rank " << r << ": " << error;
  }
  for (int r : waited) {
    const std::string& error = out.errors[static_cast<size_t>(r)];
    bool named = false;
    for (const std::string& s : published) {
      named |= error.find("; the collective check found: " + s) != std::string::npos;
    }
    EXPECT_TRUE(named) << "rank " << r << ": " << error;
  }
  // ddp-forensics: the larger set first (a tie: the one with rank 0).
  std::vector<std::pair<std::vector<int>, bool>> sets{{waited, false}, {raised, true}};
  if (raised.size() > waited.size() || (raised.size() == waited.size() && raised[0] == 0)) {
    std::swap(sets[0], sets[1]);
  }
  std::string expected = "collective #" + std::to_string(seq) + " of group ddp/world differs: ";
  for (size_t i = 0; i < sets.size(); ++i) {
    const auto& [ranks, stopped] = sets[i];
    expected += (i == 0 ? "" : "; ") + ranks_word(ranks) +
                (!stopped            ? " issued "
                 : ranks.size() == 1 ? " was stopped by the collective check before issuing "
                                     : " were stopped by the collective check before issuing ") +
                (ranks[0] == odd ? odd_one : usual);
  }
  EXPECT_EQ(out.forensics, expected);
}

class Diverged : public ::testing::TestWithParam<int> {};

TEST_P(Diverged, ARankThatSkipsABucketIsNamedAtTheBucketThatDiffers) {
  const int world = GetParam();
  TempDir dir("desync");
  const Outcome out = run_scenario("skip_bucket", world, /*check=*/false, dir);
  for (int r = 0; r < world - 1; ++r) {
    // The others' bucket 2 met no one: failed (the last rank left) or timed out.
    EXPECT_NE(out.errors[static_cast<size_t>(r)].find("ddp: bucket 2 failed on rank "),
              std::string::npos)
        << out.errors[static_cast<size_t>(r)];
  }
  EXPECT_EQ(out.errors.back(), "");  // nothing hung on the rank that skipped: silently wrong
  const std::string epoch = " of plan epoch " + std::to_string(out.epoch);
  std::vector<int> others;
  for (int r = 0; r < world - 1; ++r) others.push_back(r);
  EXPECT_EQ(out.forensics,
            "collective #" + std::to_string(out.bucket1) + " of group ddp/world differs: " +
                ranks_word(others) + " issued all-reduce (sum) of 64 Float elements for bucket 1" +
                epoch + "; rank " + std::to_string(world - 1) +
                " issued all-reduce (sum) of 64 Float elements for bucket 2" + epoch);
}

TEST_P(Diverged, TheCheckStopsARankThatSkipsABucketBeforeTheBucketThatDiffers) {
  TempDir dir("desync");
  const Outcome out = run_scenario("skip_bucket", GetParam(), /*check=*/true, dir);
  const std::string epoch = " of plan epoch " + std::to_string(out.epoch);
  expect_stopped_by_the_check(out, out.bucket1,
                              "all-reduce (sum) of 64 Float elements for bucket 1" + epoch,
                              "all-reduce (sum) of 64 Float elements for bucket 2" + epoch);
}

TEST_P(Diverged, TheCheckStopsARankWithOneParameterMoreBeforeItsFirstCollective) {
  TempDir dir("desync");
  const Outcome out = run_scenario("extra_parameter", GetParam(), /*check=*/true, dir);
  expect_stopped_by_the_check(out, 1, kFloats16, kFloats3);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Diverged, ::testing::Values(2, 3), world_name);

#endif

}  // namespace
}  // namespace ddp::testing
