// The flight recorder ([Note: flight recorder] in comm/recorder/flight_recorder.hpp): the ring
// keeps the newest collectives with what they were for and what became of them; every rank's dump
// is written when a collective fails, on SIGUSR1 (the process goes on) and on SIGTERM (it ends as
// SIGTERM would), as JSON that says who issued what.

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/comm/recorder/flight_ring.hpp"
#include "support/error_text.hpp"
#include "support/param_names.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using comm::FlightEntry;
using comm::FlightRing;
using comm::FlightState;
using comm::Purpose;
using json = nlohmann::json;

json read_dump(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no dump at " << path;
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

TEST(FlightRing, KeepsTheNewestCollectivesWithWhatTheyWereForAndWhatBecameOfThem) {
  FlightRing ring("ddp/world/mesh0/1/0", 1, {4, 5}, 3);
  int works[5];
  comm::note_step(7);
  {
    const comm::ForPurpose bucket({Purpose::kBucket, 2, 0});
    ring.record(&works[0], {"all-reduce (average)", 100, at::kFloat});
    {
      const comm::ForPurpose gather({Purpose::kUnitGather, 4});
      ring.record(&works[1], {"all-gather (flat)", 60, at::kBFloat16});
    }
    ring.record(&works[2], {"all-reduce (average)", 50, at::kFloat});  // the outer purpose again
  }
  comm::note_step(8);
  ring.record(&works[3], {"broadcast", 8, at::kLong, 0});
  ring.record(&works[4], {"barrier"});
  comm::note_step(-1);
  ring.end(&works[0], FlightState::kCompleted);  // overwritten already: left alone
  ring.end(&works[2], FlightState::kCompleted);
  ring.end(&works[3], FlightState::kFailed);
  ring.end(&works[3], FlightState::kCompleted);  // ended once only

  EXPECT_EQ(ring.issued(), 5);
  const comm::FlightGroup g = ring.snapshot();
  EXPECT_EQ(g.name, "ddp/world/mesh0/1/0");
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.global_ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(g.capacity, 3);
  ASSERT_EQ(g.entries.size(), 3u);
  const FlightEntry& third = g.entries[0];
  EXPECT_EQ(third.seq, 3);
  EXPECT_EQ(third.op.describe(), "all-reduce (average) of 50 Float elements");
  EXPECT_EQ(third.purpose.describe(), "bucket 2 of plan epoch 0");
  EXPECT_EQ(third.step, 7);
  EXPECT_EQ(third.state, FlightState::kCompleted);
  EXPECT_GE(third.ended_us, third.issued_us);
  EXPECT_GT(third.issued_us, 0);
  EXPECT_EQ(g.entries[1].seq, 4);
  EXPECT_EQ(g.entries[1].op.describe(), "broadcast from rank 0 of 8 Long elements");
  EXPECT_EQ(g.entries[1].purpose.describe(), "the user's own call");
  EXPECT_EQ(g.entries[1].step, 8);
  EXPECT_EQ(g.entries[1].state, FlightState::kFailed);
  EXPECT_EQ(g.entries[2].seq, 5);
  EXPECT_EQ(g.entries[2].state, FlightState::kIssued);
  EXPECT_EQ(g.entries[2].ended_us, 0);
  // The newest still issued: #5; of work 1 (overwritten): none.
  ASSERT_TRUE(ring.pending(nullptr).has_value());
  EXPECT_EQ(ring.pending(nullptr)->seq, 5);
  EXPECT_FALSE(ring.pending(&works[1]).has_value());
  EXPECT_EQ(comm::CollectivePurpose({Purpose::kUnitGather, 4}).describe(), "unit 4's parameters");
}

// A CUDA graph's collectives (graphs/captured_step.cpp drives this on the GPU): issued once into
// the capture, then recorded anew at each replay, as that replay's, and ended by what the replay
// did; a replay past the capacity keeps the newest.
TEST(FlightRing, ACaptureIsRecordedOnceAndEachReplayAsItsOwn) {
  FlightRing ring("ddp/world", 0, {0, 1}, 8);
  int eager = 0, captured[2];
  ring.record(&eager, {"broadcast", 8, at::kFloat, 0});
  ring.end(&eager, FlightState::kCompleted);
  const int64_t before = ring.issued();
  {
    const comm::ForPurpose bucket({Purpose::kBucket, 0, 1});
    ring.record(&captured[0], {"all-reduce (average)", 100, at::kBFloat16});
  }
  {
    const comm::ForPurpose bucket({Purpose::kBucket, 1, 1});
    ring.record(&captured[1], {"all-reduce (average)", 50, at::kBFloat16});
  }
  const comm::CapturedCollectives graph = ring.capture_since(before);
  ASSERT_EQ(graph.entries.size(), 2u);
  EXPECT_EQ(graph.lost, 0);
  comm::note_step(12);
  const int64_t first = ring.record_replay(graph, 12);
  EXPECT_EQ(first, 4);
  ring.end_range(first, first + 1, FlightState::kCompleted);
  comm::note_step(13);
  const int64_t second = ring.record_replay(graph, 13);
  ring.end_range(second, second + 1, FlightState::kTimedOut);
  comm::note_step(-1);
  const comm::FlightGroup g = ring.snapshot();
  EXPECT_EQ(g.issued, 7);
  ASSERT_EQ(g.entries.size(), 7u);
  const FlightState expected[] = {FlightState::kCompleted, FlightState::kCaptured,
                                  FlightState::kCaptured,  FlightState::kCompleted,
                                  FlightState::kCompleted, FlightState::kTimedOut,
                                  FlightState::kTimedOut};
  const int64_t replay[] = {-1, -1, -1, 12, 12, 13, 13};
  const int64_t step[] = {-1, -1, -1, 12, 12, 13, 13};
  for (size_t i = 0; i < g.entries.size(); ++i) {
    const FlightEntry& e = g.entries[i];
    EXPECT_EQ(e.seq, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(e.state, expected[i]) << i;
    EXPECT_EQ(e.replay, replay[i]) << i;
    EXPECT_EQ(e.step, step[i]) << i;
    if (i >= 1) {
      EXPECT_EQ(e.purpose.index, static_cast<int64_t>((i - 1) % 2)) << i;
      EXPECT_EQ(e.op.numel, (i - 1) % 2 == 0 ? 100 : 50) << i;
    }
  }
  // More replays than the ring holds: the oldest go, and a capture taken now lost what went.
  for (int r = 0; r < 3; ++r) ring.record_replay(graph, 14 + r);
  EXPECT_EQ(ring.snapshot().entries.front().seq, 6);
  EXPECT_EQ(ring.capture_since(1).lost, 4);
}

// Capacity 0 turns the recorder off (what its cost is measured against): collectives are still
// numbered, nothing is kept. A negative capacity is refused by name.
TEST(FlightRing, ZeroCapacityOnlyNumbersAndANegativeOneIsRefused) {
  FlightRing off("g", 0, {0}, 0);
  int work = 0;
  EXPECT_EQ(off.record(&work, {"barrier"}), 1);
  EXPECT_EQ(off.record(&work, {"barrier"}), 2);
  off.end(&work, FlightState::kCompleted);
  EXPECT_FALSE(off.pending(nullptr).has_value());
  EXPECT_EQ(off.snapshot().issued, 2);
  EXPECT_TRUE(off.snapshot().entries.empty());
  const comm::CapturedCollectives graph = off.capture_since(0);
  EXPECT_TRUE(graph.entries.empty());
  EXPECT_EQ(graph.lost, 2);
  EXPECT_THROW(FlightRing("g", 0, {0}, -1), c10::Error);
  comm::FlightRecorderOptions o;
  o.capacity = -1;
  try {
    comm::set_flight_recorder(o);
    FAIL() << "capacity -1 accepted";
  } catch (const c10::Error& e) {
    EXPECT_EQ(e.what_without_backtrace(),
              std::string("ddp: the flight recorder's capacity is a number of entries per group "
                          "(0: off), got -1"));
  }
}

// Collective #1 (bucket 0 of plan epoch 0, step 7) on every rank; then the last rank stops
// issuing (it waits on the store, as a rank stuck in its own code) while the others issue #2,
// which times out: their errors name the dump, which holds #1 completed and #2 timed out. The
// stopped rank, released, dumps on request: #1 completed, nothing more.
DDP_TEST_WORKER(flight_dump_on_failure) {
  auto pg = worker_process_group(std::chrono::seconds(2));
  const int last = pg->world_size() - 1;
  auto t = torch::ones({4});
  comm::note_step(7);
  {
    const comm::ForPurpose purpose({Purpose::kBucket, 0, 0});
    pg->allreduce_sum(t, "first all-reduce");
  }
  if (pg->rank() == last) {
    pg->store().wait({"test/release"}, std::chrono::seconds(60));
    const std::string path = comm::dump_flight_recorder("asked by the test");
    require(path == worker_env("DDP_FLIGHT_RECORDER_DIR") + "/flight-rank" + std::to_string(last) +
                        ".json",
            "dump path " + path);
    return;
  }
  const std::string error = error_of([&] { pg->allreduce_sum(t, "second all-reduce"); });
  const std::string dump =
      worker_env("DDP_FLIGHT_RECORDER_DIR") + "/flight-rank" + std::to_string(pg->rank()) + ".json";
  require(error.find("; flight recorder dump: " + dump) != std::string::npos, "error: " + error);
  if (pg->rank() == 0) pg->store().set("test/release", std::vector<uint8_t>{1});
}

class FlightDump : public ::testing::TestWithParam<int> {};

TEST_P(FlightDump, EveryRankDumpsWhatItIssuedAndWhatBecameOfIt) {
  const int world = GetParam();
  TempDir dir("flight");
  const auto result =
      run_workers(flight_dump_on_failure, world, {},
                  {{"DDP_FLIGHT_RECORDER_DIR", dir.path.string()}}, std::chrono::seconds(90));
  ASSERT_TRUE(result.ok()) << result.describe();
  for (int r = 0; r < world; ++r) {
    const json d = read_dump(dir.path.string() + "/flight-rank" + std::to_string(r) + ".json");
    EXPECT_EQ(d.at("format"), "ddp-flight-recorder");
    EXPECT_EQ(d.at("version"), comm::kFlightDumpVersion);
    EXPECT_EQ(d.at("rank"), r);
    EXPECT_EQ(d.at("world_size"), world);
    const json& g = d.at("groups").at(0);
    EXPECT_EQ(g.at("name"), "ddp/world");
    EXPECT_EQ(g.at("mesh_dim"), -1);
    EXPECT_EQ(g.at("rank"), r);
    const bool stopped = r == world - 1;
    EXPECT_EQ(g.at("issued"), stopped ? 1 : 2) << "rank " << r;
    EXPECT_EQ(d.at("reason").get<std::string>().rfind(
                  stopped ? "asked by the test" : "second all-reduce failed: ", 0),
              0u)
        << d.at("reason");
    const json& first = g.at("entries").at(0);
    EXPECT_EQ(first.at("seq"), 1);
    EXPECT_EQ(first.at("kind"), "all-reduce (sum)");
    EXPECT_EQ(first.at("dtype"), "Float");
    EXPECT_EQ(first.at("numel"), 4);
    EXPECT_EQ(first.at("purpose"), "bucket");
    EXPECT_EQ(first.at("index"), 0);
    EXPECT_EQ(first.at("epoch"), 0);
    EXPECT_EQ(first.at("step"), 7);
    EXPECT_EQ(first.at("state"), "completed");
    if (stopped) {
      EXPECT_EQ(g.at("entries").size(), 1u);
    } else {
      const json& second = g.at("entries").at(1);
      EXPECT_EQ(second.at("seq"), 2);
      EXPECT_EQ(second.at("purpose"), "user");
      EXPECT_EQ(second.at("state"), "timed out");
      EXPECT_GT(second.at("ended_us").get<int64_t>(), second.at("issued_us").get<int64_t>());
    }
  }
#ifdef DDP_FORENSICS_PATH
  // ddp-forensics names the stopped rank, what it never issued and that it is stuck outside
  // collectives (every one it issued completed).
  const auto [out, code] = run_command(std::string(DDP_FORENSICS_PATH) + " " + dir.path.string());
  ASSERT_EQ(code, 0) << out;
  const std::string others = world == 2 ? "rank 0" : "ranks 0 and 1";
  const std::string head = "rank " + std::to_string(world - 1) +
                           " never issued collective #2 of group ddp/world (all-reduce (sum) of 4 "
                           "Float elements for the user's own call), which " +
                           others + " issued from ";
  EXPECT_EQ(out.rfind(head, 0), 0u) << out;
  EXPECT_NE(out.find("; rank " + std::to_string(world - 1) + "'s last collective #1 completed at "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(every collective it issued completed: it is stuck outside collectives)\n"),
            std::string::npos)
      << out;
#endif
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FlightDump, ::testing::Values(2, 3), ddp::testing::world_name);

// SIGUSR1: a dump, and the process goes on (a second collective after it); then SIGTERM: a dump
// with both, and the process ends by SIGTERM.
DDP_TEST_WORKER(flight_dump_on_signals) {
  auto pg = worker_process_group(std::chrono::seconds(30));
  const std::string path = worker_env("DDP_FLIGHT_RECORDER_DIR") + "/flight-rank0.json";
  auto t = torch::ones({2});
  pg->allreduce_sum(t, "before SIGUSR1");
  ::raise(SIGUSR1);
  // The dump is written by the recorder's own thread: bounded wait for the file to appear.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!std::filesystem::exists(path)) {
    require(std::chrono::steady_clock::now() < deadline, "no dump 20 s after SIGUSR1");
    std::this_thread::yield();
  }
  pg->allreduce_sum(t, "after SIGUSR1");
  ::raise(SIGTERM);
  // The recorder's thread dumps, then ends this process by SIGTERM; bounded.
  pg->store().wait({"test/never-set"}, std::chrono::seconds(20));
  require(false, "still running 20 s after SIGTERM");
}

// Runs `worker` alone with the recorder dumping into a temporary folder and expects it to end by
// `signal`; its dump (null where it did not end so).
json dump_after_signal(const Worker<NoCase>& worker, int signal) {
  TempDir dir("flight");
  const auto result = run_workers(worker, 1, {}, {{"DDP_FLIGHT_RECORDER_DIR", dir.path.string()}},
                                  std::chrono::seconds(60));
  const bool ended = result.workers.size() == 1 && result.workers[0].signaled &&
                     result.workers[0].signal == signal;
  EXPECT_TRUE(ended) << "want the end by signal " << signal << ": " << result.describe();
  return ended ? read_dump(dir.path.string() + "/flight-rank0.json") : json();
}

TEST(FlightDumpSignals, SigusrDumpsAndGoesOnSigtermDumpsAndEnds) {
  const json d = dump_after_signal(flight_dump_on_signals, SIGTERM);
  ASSERT_FALSE(d.is_null());
  EXPECT_EQ(d.at("reason"), "SIGTERM");
  const json& entries = d.at("groups").at(0).at("entries");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries.at(1).at("seq"), 2);
  EXPECT_EQ(entries.at(1).at("state"), "completed");
}

// An abort (what c10d's NCCL watchdog does after its own timeout, or an uncaught exception) dumps
// before the process ends by SIGABRT.
DDP_TEST_WORKER(flight_dump_on_abort) {
  auto pg = worker_process_group(std::chrono::seconds(30));
  auto t = torch::ones({2});
  pg->allreduce_sum(t, "before the abort");
  std::abort();
}

TEST(FlightDumpSignals, AnAbortDumpsAndTheProcessStillEndsBySigabrt) {
  const json d = dump_after_signal(flight_dump_on_abort, SIGABRT);
  ASSERT_FALSE(d.is_null());
  EXPECT_EQ(d.at("reason"), "SIGABRT (the process is aborting)");
  const json& entries = d.at("groups").at(0).at("entries");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries.at(0).at("state"), "completed");
}

}  // namespace
}  // namespace ddp::testing
