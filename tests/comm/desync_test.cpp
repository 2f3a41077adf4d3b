// Desync detection: a collective that times out names the rank that is behind and the collective
// it waits on ([Note: sequence numbers] in collective_progress.hpp).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/recorder/collective_progress.hpp"
#include "support/error_text.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using comm::CollectiveProgress;
constexpr std::chrono::milliseconds kInterval(1000);

TEST(CollectiveProgress, NamesTheRankThatIsBehind) {
  // Rank 0 waits on #8; rank 1 issued 7 (fresh report), rank 2 reached #8.
  const std::string text =
      CollectiveProgress::describe(8, "all-reduce (sum) of 4 Float elements", 0,
                                   {"8 100000", "7 99800", "8 99900"}, 100000, kInterval);
  EXPECT_EQ(text,
            "; collective #8 of rank 0 (all-reduce (sum) of 4 Float elements); rank 1 is behind: "
            "it had issued 7 collectives at its last report 0.2 s ago (reports every 1.0 s), "
            "this rank waits on #8");
}

// The published states carry each rank's newest collective: the error says what the rank behind
// last did, and names a rank that issued a different collective at the same number.
TEST(CollectiveProgress, SaysWhatTheRankBehindLastDidAndADifferentCollectiveAtOneNumber) {
  const std::string mine = "all-reduce (sum) of 4 Float elements for bucket 1 of plan epoch 0";
  const std::string text = CollectiveProgress::describe(
      8, "all-reduce (sum) of 4 Float elements", 0,
      {"8 100000 issued " + mine,
       "7 99800 completed all-reduce (sum) of 4 Float elements for bucket 0 of plan epoch 0",
       "8 99900 issued all-reduce (sum) of 3 Float elements for the user's own call",
       "8 99900 timed_out " + mine},
      100000, kInterval, mine);
  EXPECT_EQ(text,
            "; collective #8 of rank 0 (all-reduce (sum) of 4 Float elements); rank 1 is behind: "
            "it had issued 7 collectives at its last report 0.2 s ago (reports every 1.0 s), "
            "this rank waits on #8; rank 1's last, #7 (all-reduce (sum) of 4 Float elements for "
            "bucket 0 of plan epoch 0), "
            "completed; rank 2 issued a different collective as #8: all-reduce (sum) of 3 Float "
            "elements for the user's own call (this rank: " +
                mine + ")");
}

TEST(CollectiveProgress, ASilentRankIsNamedDeadOrStuck) {
  const std::string text =
      CollectiveProgress::describe(3, "barrier", 1, {"2 90000", "3 100000"}, 100000, kInterval);
  EXPECT_EQ(text,
            "; collective #3 of rank 1 (barrier); rank 0 is behind: it had issued 2 collectives at "
            "its last report 10.0 s ago (reports every 1.0 s; silent since: dead or stopped), "
            "this rank waits on #3");
}

TEST(CollectiveProgress, ARankThatNeverReportedIsNamed) {
  const std::string text = CollectiveProgress::describe(1, "", 0, {"1 5000", ""}, 5000, kInterval);
  EXPECT_EQ(text,
            "; collective #1 of rank 0; rank 1 never reported (it did not start, or died before "
            "its first collective)");
}

TEST(CollectiveProgress, EveryRankPresentMeansTheFailureIsInTheCollective) {
  const std::string text =
      CollectiveProgress::describe(5, "barrier", 0, {"5 1000", "5 1000"}, 1200, kInterval);
  EXPECT_EQ(text,
            "; collective #5 of rank 0 (barrier); every rank reached this collective (a peer may "
            "have failed in it)");
}

TEST(CollectiveProgress, NumbersCollectivesInIssueOrder) {
  CollectiveProgress progress(c10::intrusive_ptr<c10d::Store>(), 0, 1, kInterval);
  EXPECT_EQ(progress.issued(nullptr, {"a"}), 1);
  EXPECT_EQ(progress.issued(nullptr, {"b"}), 2);
  EXPECT_EQ(progress.count(), 2);
  EXPECT_EQ(progress.report(nullptr), "; collective #2");
}

// All ranks take part in collective #1; then rank 1 stops issuing collectives (it waits on the
// store, as a rank stuck in its own code would) while the others issue #2 and time out after 2 s.
// Their errors must name rank 1 as behind at 1 collective, and say that its last one completed.
DDP_TEST_WORKER(desync) {
  auto pg = worker_process_group(std::chrono::seconds(2));
  auto t = torch::ones({4});
  pg->allreduce_sum(t, "first all-reduce");
  if (pg->rank() == 1) {
    // Bounded, and longer than the others' 2 s collective timeout; released by rank 0.
    pg->store().wait({"test/release"}, std::chrono::seconds(60));
    return;
  }
  const std::string error = error_of([&] { pg->allreduce_sum(t, "second all-reduce"); });
  require(!error.empty(), "the second all-reduce did not fail");
  const std::string expected_head =
      "ddp: second all-reduce failed on rank " + std::to_string(pg->rank()) + " of " +
      std::to_string(pg->world_size()) + " (collective timeout 2000 ms";
  require(error.find(expected_head) != std::string::npos, "error head: " + error);
  const std::string expected = "; collective #2 of rank " + std::to_string(pg->rank()) +
                               " (all-reduce (sum) of 4 Float elements); rank 1 is behind: it "
                               "had issued 1 collectives at its last report ";
  require(error.find(expected) != std::string::npos, "desync report: " + error);
  require(error.find(" s), this rank waits on #2;") != std::string::npos, "waits on: " + error);
  // What rank 1 last did, from its published state (heartbeat every 100 ms, 2 s of waiting).
  const std::string last =
      "; rank 1's last, #1 (all-reduce (sum) of 4 Float elements for the user's own call), "
      "completed";
  require(error.find(last) != std::string::npos, "rank 1's last collective: " + error);
  // Rank 0 holds the store, which every failing rank reads to build its report: it lets rank 1
  // go (and itself end) only once every other rank has its report. A rank 2 slower than rank 0
  // read a closed store ("Broken pipe") on a loaded machine.
  pg->store().set("test/reported/" + std::to_string(pg->rank()), std::vector<uint8_t>{1});
  if (pg->rank() == 0) {
    std::vector<std::string> reported;
    for (int r = 0; r < pg->world_size(); ++r) {
      if (r != 1) reported.push_back("test/reported/" + std::to_string(r));
    }
    pg->store().wait(reported, std::chrono::seconds(60));
    pg->store().set("test/release", std::vector<uint8_t>{1});
  }
}

class Desync : public ::testing::TestWithParam<int> {};

TEST_P(Desync, TheErrorNamesTheRankThatIsBehind) {
  EXPECT_WORKERS_PASS(
      run_workers(desync, GetParam(), {}, {{"DDP_HEARTBEAT_MS", "100"}}, std::chrono::seconds(90)));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Desync, ::testing::Values(2, 3), ddp::testing::world_name);

}  // namespace
}  // namespace ddp::testing
