// Flight recorder dumps read back and lined up (comm/recorder/flight_dump.hpp): each kind of
// divergence named in one exact sentence; a damaged or foreign dump refused by name, never a crash
// (a fuzz over a real dump's text).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/recorder/flight_divergence.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::testing {
namespace {

using comm::RankDump;
using json = nlohmann::json;

// 12:01:03.000 UTC on 2026-11-27, in microseconds; entry k issued k ms later, ended 1 ms after.
constexpr int64_t kT0 = 1795780863000000;

json entry(int64_t seq, const std::string& kind, int64_t numel, const std::string& purpose,
           int64_t index, const std::string& state, const std::string& dtype = "Float") {
  return {{"seq", seq},
          {"kind", kind},
          {"dtype", dtype},
          {"numel", numel},
          {"root", -1},
          {"purpose", purpose},
          {"index", index},
          {"epoch", purpose == "bucket" ? 0 : -1},
          {"step", 12},
          {"issued_us", kT0 + seq * 1000},
          {"ended_us", state == "issued" ? 0 : kT0 + seq * 1000 + 1000},
          {"state", state}};
}

// Rank `rank` of `world` with one group "ddp/world" holding `entries`.
json dump(int rank, int world, const std::vector<json>& entries) {
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(r);
  return {{"format", "ddp-flight-recorder"},
          {"version", comm::kFlightDumpVersion},
          {"rank", rank},
          {"world_size", world},
          {"pid", 1},
          {"host", "h"},
          {"reason", "test"},
          {"dumped_us", kT0 + 60000000},  // a minute after the first entry
          {"groups",
           {{{"name", "ddp/world"},
             {"mesh_dim", -1},
             {"rank", rank},
             {"global_ranks", ranks},
             {"issued", entries.empty() ? 0 : entries.back().at("seq").get<int64_t>()},
             {"capacity", 4096},
             {"entries", entries}}}}};
}

std::vector<RankDump> parsed(const std::vector<json>& dumps) {
  std::vector<RankDump> out;
  for (size_t i = 0; i < dumps.size(); ++i) {
    out.push_back(comm::parse_flight_dump(dumps[i].dump(), "rank" + std::to_string(i)));
  }
  return out;
}

std::vector<json> bucket_steps(int n, const std::string& last_state = "completed") {
  std::vector<json> e;
  for (int k = 1; k <= n; ++k) {
    e.push_back(entry(k, "all-reduce (average)", 6300000, "bucket", k % 4,
                      k == n ? last_state : "completed"));
  }
  return e;
}

TEST(FlightDivergence, ARankThatNeverIssuedACollectiveIsNamedWithWhatItWas) {
  const auto d = comm::first_divergence(
      parsed({dump(0, 3, bucket_steps(8, "issued")), dump(1, 3, bucket_steps(8, "issued")),
              dump(2, 3, bucket_steps(7))}),
      3);
  EXPECT_EQ(d.kind, "missing");
  EXPECT_EQ(d.ranks, std::vector<int>{2});
  EXPECT_EQ(d.sentence,
            "rank 2 never issued collective #8 of group ddp/world (all-reduce (average) of 6300000 "
            "Float elements for bucket 0 of plan epoch 0), which ranks 0 and 1 issued from "
            "12:01:03.008; rank 2's last collective #7 completed at 12:01:03.008 (every collective "
            "it issued completed: it is stuck outside collectives)");
  // The same with a stop on record (the launcher continued rank 2; no wait of the others broke, as
  // under NCCL where the watchdog ends the process): stopped, not stuck.
  std::vector<json> dumps{dump(0, 3, bucket_steps(8, "issued")),
                          dump(1, 3, bucket_steps(8, "issued")), dump(2, 3, bucket_steps(7))};
  dumps[2]["continued_us"] = kT0 + 50000000;
  const auto stopped = comm::first_divergence(parsed(dumps), 3);
  EXPECT_EQ(stopped.sentence.substr(stopped.sentence.find(" (every")),
            " (every collective it issued completed: it was stopped, continued at 12:01:53.000)");
}

// Dumps of a running job (SIGTERM from the launcher, SIGUSR1) catch the ranks a collective apart:
// the rank behind is named, but as running, not stuck.
TEST(FlightDivergence, ARankJustBehindInADumpOfARunningJobIsNotCalledStuck) {
  std::vector<json> dumps{dump(0, 2, bucket_steps(8, "issued")), dump(1, 2, bucket_steps(7))};
  for (json& d : dumps) d["dumped_us"] = kT0 + 8 * 1000 + 250;  // 250 us after #8's issue
  const auto d = comm::first_divergence(parsed(dumps), 2);
  EXPECT_EQ(d.kind, "missing");
  EXPECT_EQ(d.sentence,
            "rank 1 never issued collective #8 of group ddp/world (all-reduce (average) of 6300000 "
            "Float elements for bucket 0 of plan epoch 0), which rank 0 issued from "
            "12:01:03.008; rank 1's last collective #7 completed at 12:01:03.008 (0 ms before "
            "its dump: it was running, not stuck)");
}

TEST(FlightDivergence, DifferentCollectivesAtOneNumberAreNamedRankByRank) {
  std::vector<json> odd = bucket_steps(5);
  odd[4] = entry(5, "all-gather (flat)", 1200000, "unit gather", 4, "issued", "BFloat16");
  const auto d =
      comm::first_divergence(parsed({dump(0, 3, bucket_steps(5, "issued")),
                                     dump(1, 3, bucket_steps(5, "issued")), dump(2, 3, odd)}),
                             3);
  EXPECT_EQ(d.kind, "mismatch");
  EXPECT_EQ(d.seq, 5);
  EXPECT_EQ(d.ranks, std::vector<int>{2});
  EXPECT_EQ(d.sentence,
            "collective #5 of group ddp/world differs: ranks 0 and 1 issued all-reduce (average) "
            "of 6300000 Float elements for bucket 1 of plan epoch 0; rank 2 issued all-gather "
            "(flat) of 1200000 BFloat16 elements for unit 4's parameters");
}

TEST(FlightDivergence, ARankWithoutADumpAndAgreeingRanksAreSaidSo) {
  const auto none =
      comm::first_divergence(parsed({dump(0, 2, bucket_steps(4)), dump(1, 2, bucket_steps(4))}), 2);
  EXPECT_EQ(none.kind, "none");
  EXPECT_EQ(none.sentence, "no divergence: every rank issued the same collectives in every group");
  const auto absent = comm::first_divergence(parsed({dump(0, 2, bucket_steps(4))}), 2);
  EXPECT_EQ(absent.kind, "no dump");
  EXPECT_EQ(absent.sentence,
            "rank 1 left no dump (killed, or never started) and the others agree on every "
            "collective they hold");
  // A killed rank while the others wait in a collective: where they wait.
  const auto killed = comm::first_divergence(
      parsed({dump(0, 3, bucket_steps(4, "issued")), dump(2, 3, bucket_steps(4, "issued"))}), 3);
  EXPECT_EQ(killed.kind, "no dump");
  EXPECT_EQ(killed.sentence,
            "rank 1 left no dump (killed, or never started) and the others agree on every "
            "collective they hold; ranks 0 and 2 wait in collective #4 of group ddp/world "
            "(all-reduce (average) of 6300000 Float elements for bucket 0 of plan epoch 0, step "
            "12, issued at 12:01:03.004)");
  // One timed out (after 1 ms), a slower one still waited when the launcher ended it, within its
  // own timeout (so not stuck): each said.
  json slower = dump(2, 3, bucket_steps(4, "issued"));
  slower["dumped_us"] = kT0 + 4000 + 500;
  const auto mixed =
      comm::first_divergence(parsed({dump(0, 3, bucket_steps(4, "timed out")), slower}), 3);
  EXPECT_EQ(mixed.kind, "no dump");
  EXPECT_EQ(mixed.sentence,
            "rank 1 left no dump (killed, or never started) and the others agree on every "
            "collective they hold; ranks 0 and 2 are in collective #4 of group ddp/world "
            "(all-reduce (average) of 6300000 Float elements for bucket 0 of plan epoch 0, step "
            "12, issued at 12:01:03.004): rank 0 timed out, rank 2 still waiting");
}

// A skipped step: rank 1 ran on from step 12 to step 13's collectives at #5 while rank 0 ran step
// 12's; the collectives themselves are alike, the step tags are not.
TEST(FlightDivergence, ASkippedStepIsNamedFromTheStepTags) {
  std::vector<json> skipped = bucket_steps(8);
  for (size_t k = 4; k < skipped.size(); ++k) skipped[k]["step"] = 13;
  std::vector<json> on_time = bucket_steps(8);
  for (size_t k = 4; k < on_time.size(); ++k) on_time[k]["step"] = 12;
  const auto d = comm::first_divergence(
      parsed({dump(0, 3, on_time), dump(1, 3, skipped), dump(2, 3, on_time)}), 3);
  EXPECT_EQ(d.kind, "steps");
  EXPECT_EQ(d.ranks, std::vector<int>{1});
  EXPECT_EQ(d.sentence,
            "rank 1 ran step 13's collectives one step early from collective #5 of group "
            "ddp/world (ranks 0 and 2 ran step 12's there)");
  // The other way round: a rank that repeats a step runs its collectives late.
  for (size_t k = 4; k < skipped.size(); ++k) skipped[k]["step"] = 10;
  const auto late = comm::first_divergence(parsed({dump(0, 2, on_time), dump(1, 2, skipped)}), 2);
  EXPECT_EQ(late.sentence,
            "rank 1 ran step 10's collectives 2 steps late from collective #5 of group ddp/world "
            "(rank 0 ran step 12's there)");
}

// Rank 0 timed out in #8 two seconds after issuing it; rank `other` holds #8 as issued.
std::vector<json> timed_out_in_8(int world, int other, int64_t other_issued_us) {
  std::vector<json> dumps;
  for (int r = 0; r < world; ++r) {
    std::vector<json> e = bucket_steps(8, r == 0 ? "timed out" : "issued");
    if (r == 0) e[7]["ended_us"] = kT0 + 8 * 1000 + 2000000;
    if (r == other) e[7]["issued_us"] = other_issued_us;
    dumps.push_back(dump(r, world, e));
    dumps.back()["dumped_us"] = kT0 + 8 * 1000 + 2100000;  // 0.1 s after the timeout
  }
  return dumps;
}

// The SIGSTOPped rank of a launcher's job: continued (SIGCONT) only when the launcher stopped
// the job, after rank 0 had timed out waiting for it. Named whether it stopped inside the
// collective or before it, and whatever it did once continued.
TEST(FlightDivergence, AStoppedRankIsNamedInsideOrBeforeTheCollective) {
  std::vector<json> inside = timed_out_in_8(2, 1, kT0 + 8 * 1000);
  inside[1]["continued_us"] = kT0 + 8 * 1000 + 2050000;
  const auto d = comm::first_divergence(parsed(inside), 2);
  EXPECT_EQ(d.kind, "stopped");
  EXPECT_EQ(d.ranks, std::vector<int>{1});
  EXPECT_EQ(d.sentence,
            "rank 1 issued collective #8 of group ddp/world (all-reduce (average) of 6300000 Float "
            "elements for bucket 0 of plan epoch 0) at 12:01:03.008 and never completed it: it "
            "was stopped inside it (continued at 12:01:05.058, after rank 0 had timed out in it "
            "at 12:01:05.008)");
  // Once continued, its own wait timed out at once (the deadline passed while it was stopped):
  // still the stopped rank, and rank 0 still the one that timed out first.
  inside[1]["groups"][0]["entries"][7]["state"] = "timed out";
  inside[1]["groups"][0]["entries"][7]["ended_us"] = kT0 + 8 * 1000 + 2051000;
  EXPECT_EQ(comm::first_divergence(parsed(inside), 2).sentence, d.sentence);
  // Stopped before #8, which it issued once continued (its dump came after): the same rank.
  std::vector<json> before = timed_out_in_8(3, 2, kT0 + 8 * 1000 + 2060000);
  before[2]["continued_us"] = kT0 + 8 * 1000 + 2050000;
  before[1]["groups"][0]["entries"][7]["state"] = "timed out";
  before[1]["groups"][0]["entries"][7]["ended_us"] = kT0 + 8 * 1000 + 2000500;
  const auto b = comm::first_divergence(parsed(before), 3);
  EXPECT_EQ(b.kind, "stopped");
  EXPECT_EQ(b.ranks, std::vector<int>{2});
  EXPECT_EQ(b.sentence,
            "rank 2 never issued collective #8 of group ddp/world (all-reduce (average) of 6300000 "
            "Float elements for bucket 0 of plan epoch 0) before ranks 0 and 1 had timed out in it "
            "from 12:01:05.008: it was stopped before it (continued at 12:01:05.058); its "
            "collective #7 completed at 12:01:03.008");
}

// No stop on record (another launcher): a rank still inside the collective longer than the
// timeout the other rank ran into is named as stopped or stuck; one that dumped within it is not.
TEST(FlightDivergence, ARankInsideACollectivePastTheTimeoutIsCalledStoppedOrStuck) {
  const auto d = comm::first_divergence(parsed(timed_out_in_8(2, 1, kT0 + 8 * 1000)), 2);
  EXPECT_EQ(d.kind, "stuck");
  EXPECT_EQ(d.sentence,
            "rank 1 issued collective #8 of group ddp/world (all-reduce (average) of 6300000 Float "
            "elements for bucket 0 of plan epoch 0) from 12:01:03.008 and never completed it: "
            "stopped or stuck inside it (rank 0 had timed out in it at 12:01:05.008)");
  // Issued 1 s after rank 0: dumped 1.1 s later, within the 2 s timeout: nothing to say of it.
  const auto within =
      comm::first_divergence(parsed(timed_out_in_8(2, 1, kT0 + 8 * 1000 + 1000000)), 2);
  EXPECT_EQ(within.kind, "broke");
  EXPECT_EQ(within.sentence,
            "every rank issued the same collectives, but rank 0 timed out in collective #8 of "
            "group ddp/world (all-reduce (average) of 6300000 Float elements for bucket 0 of plan "
            "epoch 0) at 12:01:05.008 and no rank is known to have been stopped or stuck in it");
}

std::string refusal(const std::string& text) {
  try {
    comm::parse_flight_dump(text, "d.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A CUDA graph's collectives: captured once (not where a rank waits), then each replay's.
TEST(FlightDumpRead, AReplaysCollectivesSayWhichReplayAndTheCaptureIsNotAWait) {
  std::vector<json> entries{entry(1, "all-reduce (average)", 100, "bucket", 0, "captured"),
                            entry(2, "all-reduce (average)", 100, "bucket", 0, "completed"),
                            entry(3, "all-reduce (average)", 100, "bucket", 0, "issued")};
  entries[1]["replay"] = 11;
  entries[2]["replay"] = 12;
  const RankDump d = comm::parse_flight_dump(dump(0, 2, entries).dump(), "d.json");
  const auto& e = d.groups[0].entries;
  EXPECT_EQ(e[0].replay, -1);
  EXPECT_EQ(e[2].describe(),
            "all-reduce (average) of 100 Float elements for bucket 0 of plan epoch 0 (replay of "
            "captured step 12)");
  // Rank 1 stopped after the first replay: named with the replay it never issued.
  std::vector<json> behind(entries.begin(), entries.begin() + 2);
  const auto div = comm::first_divergence(parsed({dump(0, 2, entries), dump(1, 2, behind)}), 2);
  EXPECT_EQ(div.sentence.rfind("rank 1 never issued collective #3 of group ddp/world (all-reduce "
                               "(average) of 100 Float elements for bucket 0 of plan epoch 0 "
                               "(replay of captured step 12)), which rank 0 issued from ",
                               0),
            0u)
      << div.sentence;
  EXPECT_NE(div.sentence.find("(every collective it issued completed: it is stuck outside "
                              "collectives)"),
            std::string::npos)
      << div.sentence;
}

TEST(FlightDumpRead, ADamagedOrForeignDumpIsRefusedByName) {
  const json good = dump(0, 2, bucket_steps(3));
  EXPECT_EQ(refusal(good.dump()), "");
  EXPECT_EQ(refusal("{\"format\": \"safetensors\"}"),
            "d.json: not a flight recorder dump (no \"format\": \"ddp-flight-recorder\")");
  json v2 = good;
  v2["version"] = 2;
  EXPECT_EQ(refusal(v2.dump()), "d.json: a dump of version 2; this tool reads version 1");
  json bad_seq = good;
  bad_seq["groups"][0]["entries"][1]["seq"] = "two";
  EXPECT_EQ(refusal(bad_seq.dump()), "d.json: field 'groups[0].entries[1].seq' is not an integer");
  json gap = good;
  gap["groups"][0]["entries"][2]["seq"] = 4;
  EXPECT_EQ(refusal(gap.dump()), "d.json: field 'groups[0].entries[2].seq' is 4, expected 3");
  json state = good;
  state["groups"][0]["entries"][0]["state"] = "maybe";
  EXPECT_EQ(refusal(state.dump()),
            "d.json: field 'groups[0].entries[0].state' is 'maybe', not a collective's state");
  json replay = good;
  replay["groups"][0]["entries"][1]["replay"] = "twelve";
  EXPECT_EQ(refusal(replay.dump()),
            "d.json: field 'groups[0].entries[1].replay' is not an integer");
  EXPECT_EQ(
      refusal(good.dump().substr(0, 40)).rfind("d.json: not a flight recorder dump (not JSON", 0),
      0u);
}

TEST(FlightDumpRead, FuzzedDumpsAreReadOrRefusedByNameNeverACrash) {
  const std::string good = dump(1, 3, bucket_steps(6)).dump(1);
  std::mt19937 rng(49);
  int refused = 0, read = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = good;
    switch (i % 3) {
      case 0:  // truncated
        text.resize(rng() % text.size());
        break;
      case 1:  // a byte replaced
        text[rng() % text.size()] = static_cast<char>(rng() % 256);
        break;
      default:  // a run of bytes deleted
        text.erase(rng() % text.size(), 1 + rng() % 16);
    }
    const std::string why = refusal(text);
    if (why.empty()) {
      ++read;
    } else {
      ++refused;
      EXPECT_EQ(why.rfind("d.json: ", 0), 0u) << why;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(read, 0);  // harmless bytes (inside a string, whitespace) still read
}

}  // namespace
}  // namespace ddp::testing
