// ddp-run, driven as a user drives it: the real binary, with small /bin/sh workers (fast, no
// torch) and one real ddp-train job. Waits are on events (the launcher's exit, files the workers
// write, a FIFO the test opens) and every wait has a bound.

#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/launch/spawn.hpp"
#include "launch/ddp_run_harness.hpp"
#include "support/param_names.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

namespace {

using namespace ddp::testing;

const char* kPrintEnv =
    "echo \"RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
    "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
    "DDP_RESTART_COUNT=$DDP_RESTART_COUNT GROUP_RANK=$GROUP_RANK\"";

std::string env_line(int rank, int local_rank, int world, int local_world, const std::string& addr,
                     int port, int group_rank) {
  return "[rank " + std::to_string(rank) + "] RANK=" + std::to_string(rank) +
         " LOCAL_RANK=" + std::to_string(local_rank) + " WORLD_SIZE=" + std::to_string(world) +
         " LOCAL_WORLD_SIZE=" + std::to_string(local_world) + " MASTER_ADDR=" + addr +
         " MASTER_PORT=" + std::to_string(port) +
         " DDP_RESTART_COUNT=0 GROUP_RANK=" + std::to_string(group_rank);
}

class DdpRunWorldSize : public ::testing::TestWithParam<int> {};

TEST_P(DdpRunWorldSize, EveryWorkerSeesTheTorchrunEnvironment) {
  const int n = GetParam();
  TempDir dir;
  // A RANK inherited from the caller (a launcher inside a launcher) must not leak through.
  // /proc/$$/environ is what exec gave the worker: a shell would hide a duplicate entry.
  const auto f = ddp_run(
      sh({"--nproc-per-node", std::to_string(n)},
         std::string(kPrintEnv) + "; echo \"RANK entries: $(tr '\\0' '\\n' < /proc/$$/environ | "
                                  "grep -c '^RANK=')\""),
      dir, {{"RANK", "99"}, {"DDP_RESTART_COUNT", "7"}});
  ASSERT_EQ(f.code, 0) << f.err;
  int port = 0;
  ASSERT_EQ(std::sscanf(f.out.substr(f.out.find("MASTER_PORT=")).c_str(), "MASTER_PORT=%d", &port),
            1)
      << f.out;
  EXPECT_GT(port, 0);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(f.out.find(env_line(r, r, n, n, "127.0.0.1", port, 0) + "\n"), std::string::npos)
        << "rank " << r << " in:\n"
        << f.out;
    EXPECT_NE(f.out.find("[rank " + std::to_string(r) + "] RANK entries: 1\n"), std::string::npos)
        << f.out;
  }
  EXPECT_EQ(lines(f.out).size(), static_cast<size_t>(2 * n)) << f.out;
}

INSTANTIATE_TEST_SUITE_P(DdpRun, DdpRunWorldSize, ::testing::Values(1, 2, 3),
                         ddp::testing::world_name);

TEST(DdpRun, SecondNodeOffsetsRanksByNodeRank) {
  TempDir dir;
  const auto f = ddp_run(sh({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1",
                             "--master-addr", "10.0.0.7", "--master-port", "29511"},
                            kPrintEnv),
                         dir);
  ASSERT_EQ(f.code, 0) << f.err;
  for (int lr = 0; lr < 3; ++lr) {
    EXPECT_NE(f.out.find(env_line(3 + lr, lr, 6, 3, "10.0.0.7", 29511, 1) + "\n"),
              std::string::npos)
        << f.out;
  }
  EXPECT_EQ(f.out.find("[rank 0]"), std::string::npos) << "node 1 started node 0's ranks\n"
                                                       << f.out;
  EXPECT_EQ(lines(f.out).size(), 3u) << f.out;
}

// torchrun's own spellings, so that its command lines run unchanged under ddp-run.
TEST(DdpRun, AcceptsTorchrunSpellings) {
  TempDir dir;
  const auto f =
      ddp_run(sh({"--nproc_per_node", "2", "--node_rank", "0", "--master_addr", "127.0.0.2",
                  "--master_port", "29517", "--max_restarts", "0", "--no_python"},
                 "echo \"$WORLD_SIZE $MASTER_ADDR:$MASTER_PORT\""),
              dir);
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.out.find("[rank 1] 2 127.0.0.2:29517\n"), std::string::npos) << f.out;
}

TEST(DdpRun, PrefixesEveryLineWithItsRankOnTheSameStream) {
  TempDir dir;
  // `sh`, not `/bin/sh`: the program is looked up in PATH.
  const auto f = ddp_run({"--nproc-per-node", "2", "--", "sh", "-c",
                          "echo \"out $RANK\"; echo \"err $RANK\" >&2; printf 'tail %s' $RANK"},
                         dir);
  ASSERT_EQ(f.code, 0) << f.err;
  for (const std::string r : {"0", "1"}) {
    EXPECT_NE(f.out.find("[rank " + r + "] out " + r + "\n"), std::string::npos) << f.out;
    // The last line had no newline: still printed, as a whole line.
    EXPECT_NE(f.out.find("[rank " + r + "] tail " + r + "\n"), std::string::npos) << f.out;
    EXPECT_NE(f.err.find("[rank " + r + "] err " + r + "\n"), std::string::npos) << f.err;
  }
  EXPECT_EQ(f.out.find("err"), std::string::npos) << "stderr leaked into stdout\n" << f.out;
  EXPECT_EQ(lines(f.out).size(), 4u) << f.out;
}

TEST(DdpRun, LongLinesFromManyWorkersNeverInterleave) {
  TempDir dir;
  // Lines longer than a pipe's atomic write (4 KiB) from 3 workers at once: each must come out
  // whole, after its own prefix.
  const int kLines = 200;
  const auto f = ddp_run(sh({"--nproc-per-node", "3"},
                            "l=$(printf '%05000d' $RANK); i=0; while [ $i -lt " +
                                std::to_string(kLines) + " ]; do echo \"$l\"; i=$((i+1)); done"),
                         dir);
  ASSERT_EQ(f.code, 0) << f.err;
  std::map<int, int> per_rank;
  for (const auto& line : lines(f.out)) {
    int rank = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "[rank %d] ", &rank), 1) << line.substr(0, 80);
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    ASSERT_EQ(line, prefix + std::string(4999, '0') + std::to_string(rank))
        << "line " << per_rank[rank] << " of rank " << rank << " is torn";
    ++per_rank[rank];
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(per_rank[r], kLines) << "rank " << r;
}

TEST(DdpRun, AFailingWorkerStopsTheOthers) {
  TempDir dir;
  const std::string gate = make_gate(dir);
  const auto l = start_ddp_run(
      sh({"--nproc-per-node", "3"}, record_pid(dir) + "if [ $RANK = 2 ]; then read x < '" + gate +
                                        "'; exit 3; fi; exec sleep 60"),
      dir);
  const auto pids = wait_for_pids(dir, {0, 1, 2});
  ASSERT_EQ(pids.size(), 3u) << read_file(l.err_path);
  const auto released = Clock::now();
  ASSERT_TRUE(release_gate(gate));
  const auto f = wait_ddp_run(l);
  const double seconds = std::chrono::duration<double>(Clock::now() - released).count();
  reap_leftovers(pids);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 2 exited with code 3\n"), std::string::npos) << f.err;
  // Only the first failure is reported: the others were stopped, not failed.
  EXPECT_EQ(count(f.err, "ddp-run: rank "), 1) << f.err;
  // `sleep` dies at SIGTERM: no wait for the 10 s grace.
  EXPECT_LT(seconds, 8.0) << f.err;
  for (pid_t p : pids) EXPECT_TRUE(process_gone(p)) << "worker " << p << " survived";
}

TEST(DdpRun, AWorkerKilledBySignalIsNamedAndNoWorkerRemains) {
  TempDir dir;
  const auto l =
      start_ddp_run(sh({"--nproc-per-node", "3"}, record_pid(dir) + "exec sleep 60"), dir);
  const auto pids = wait_for_pids(dir, {0, 1, 2});
  ASSERT_EQ(pids.size(), 3u) << read_file(l.err_path);
  ::kill(pids[1], SIGKILL);
  const auto f = wait_ddp_run(l);
  reap_leftovers(pids);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 was killed by signal 9"), std::string::npos) << f.err;
  EXPECT_EQ(count(f.err, "ddp-run: rank "), 1) << f.err;
  for (pid_t p : pids) EXPECT_TRUE(process_gone(p)) << "worker " << p << " survived";
}

TEST(DdpRun, AWorkerIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  const std::string gate = make_gate(dir);
  const auto l =
      start_ddp_run(sh({"--nproc-per-node", "2", "--grace-s", "1"},
                       "if [ $RANK = 0 ]; then " + record_pid(dir) + "read x < '" + gate +
                           "'; exit 3; fi; trap '' TERM; " + record_pid(dir) + "exec sleep 60"),
                    dir);
  const auto pids = wait_for_pids(dir, {0, 1});
  ASSERT_EQ(pids.size(), 2u) << read_file(l.err_path);
  const auto released = Clock::now();
  ASSERT_TRUE(release_gate(gate));
  const auto f = wait_ddp_run(l);
  const double seconds = std::chrono::duration<double>(Clock::now() - released).count();
  reap_leftovers(pids);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 0 exited with code 3\n"), std::string::npos) << f.err;
  EXPECT_GE(seconds, 1.0) << "SIGKILL came before the 1 s grace";
  EXPECT_LT(seconds, 8.0) << "the SIGKILL escalation did not happen";
  EXPECT_TRUE(process_gone(pids[1]));
}

class DdpRunSignal : public ::testing::TestWithParam<int> {};

TEST_P(DdpRunSignal, ReachesEveryWorkerAndNoWorkerRemains) {
  const int sig = GetParam();
  TempDir dir;
  // The trap proves the signal itself reached the worker: without forwarding, the workers would
  // still die (PR_SET_PDEATHSIG) but never write their file.
  const auto l = start_ddp_run(
      sh({"--nproc-per-node", "2"}, "trap 'echo got > \"$D/sig.$RANK\"; kill $c; exit 0' " +
                                        std::string(sig == SIGINT ? "INT" : "TERM") +
                                        "; sleep 60 & c=$!; " + record_pid(dir) + "wait $c"),
      dir);
  const auto pids = wait_for_pids(dir, {0, 1});
  ASSERT_EQ(pids.size(), 2u) << read_file(l.err_path);
  ::kill(l.pid, sig);
  const auto f = wait_ddp_run(l, 30s);
  reap_leftovers(pids);
  EXPECT_EQ(f.code, 128 + sig) << f.err;
  EXPECT_NE(f.err.find("ddp-run: got signal " + std::to_string(sig)), std::string::npos) << f.err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read_file(dir.file("sig." + std::to_string(r))), "got\n") << "rank " << r;
    EXPECT_TRUE(process_gone(pids[r])) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(DdpRun, DdpRunSignal, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGTERM ? "SIGTERM" : "SIGINT");
                         });

TEST(DdpRun, SigkillOfTheLauncherTakesTheWorkersWithIt) {
  TempDir dir;
  const auto l =
      start_ddp_run(sh({"--nproc-per-node", "2"}, record_pid(dir) + "exec sleep 60"), dir);
  const auto pids = wait_for_pids(dir, {0, 1});
  ASSERT_EQ(pids.size(), 2u) << read_file(l.err_path);
  ::kill(l.pid, SIGKILL);
  const auto f = wait_ddp_run(l);
  EXPECT_EQ(f.signal, SIGKILL);
  // The workers' deaths are asynchronous to ddp-run's (PR_SET_PDEATHSIG): wait for them, bounded.
  const bool gone = wait_until([&] { return process_gone(pids[0]) && process_gone(pids[1]); }, 10s);
  reap_leftovers(pids);
  EXPECT_TRUE(gone) << "a worker outlived a SIGKILLed ddp-run";
}

TEST(DdpRun, TheJobTimeoutStopsEveryWorker) {
  TempDir dir;
  const auto l = start_ddp_run(
      sh({"--nproc-per-node", "2", "--job-timeout-s", "0.5"}, record_pid(dir) + "exec sleep 60"),
      dir);
  const auto f = wait_ddp_run(l);
  const auto pids = wait_for_pids(dir, {0, 1});  // written long before the timeout
  reap_leftovers(pids);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("ddp-run: timed out (--job-timeout-s)"), std::string::npos) << f.err;
  EXPECT_LT(f.seconds, 8.0);
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t p : pids) EXPECT_TRUE(process_gone(p));
}

// --timeout-s is every worker's collective timeout (DDP_TIMEOUT_S), not a bound on the job: a
// worker sees it in its environment and outlives it.
TEST(DdpRun, TheCollectiveTimeoutReachesEveryWorker) {
  TempDir dir;
  const auto f = ddp_run(sh({"--nproc-per-node", "2", "--timeout-s", "0.5"},
                            "sleep 1; echo \"timeout $DDP_TIMEOUT_S\""),
                         dir);
  EXPECT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(count(f.out, "] timeout 0.5\n"), 2) << f.out;
}

TEST(DdpRun, AProgramThatCannotRunIsReported) {
  TempDir dir;
  const auto f = ddp_run({"--", dir.file("no-such-program")}, dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("[rank 0] ddp-run: cannot run " + dir.file("no-such-program") +
                       ": No such file or directory\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 0 exited with code 127\n"), std::string::npos) << f.err;
}

struct BadFlags {
  std::vector<std::string> args;
  std::string error;
};

void PrintTo(const BadFlags& f, std::ostream* os) {
  *os << "ddp-run";
  for (const auto& a : f.args) *os << ' ' << a;
}

// The flags before the program as a test name: --nnodes 2 --node-rank 2 -> nnodes_2_node_rank_2;
// a bare "--" with nothing after it is "dashdash", a negative number "minus1".
std::string bad_flags_name(const ::testing::TestParamInfo<BadFlags>& info) {
  std::vector<std::string> args = info.param.args;
  const std::vector<std::string> program = {"--", "/bin/sh", "-c", "PROGRAM"};
  if (args.size() >= program.size() &&
      std::equal(program.begin(), program.end(), args.end() - program.size())) {
    args.resize(args.size() - program.size());
  }
  std::string name;
  for (const auto& a : args) {
    std::string word = a;
    if (word == "--") {
      word = "dashdash";
    } else if (word.size() > 1 && word[0] == '-' &&
               std::isdigit(static_cast<unsigned char>(word[1]))) {
      word = "minus" + word.substr(1);
    }
    for (char c : word) {
      const bool keep = std::isalnum(static_cast<unsigned char>(c));
      if (keep) {
        name += c;
      } else if (!name.empty() && name.back() != '_') {
        name += '_';
      }
    }
    if (!name.empty() && name.back() != '_') name += '_';
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

class DdpRunBadFlags : public ::testing::TestWithParam<BadFlags> {};

TEST_P(DdpRunBadFlags, AreRefusedWithTheFlagNamed) {
  TempDir dir;
  // The program would leave a file if it ever ran.
  auto args = GetParam().args;
  for (auto& a : args) {
    if (a == "PROGRAM") a = "touch '" + dir.file("ran") + "'";
  }
  const auto f = ddp_run(args, dir);
  EXPECT_EQ(f.code, 2) << f.err;
  EXPECT_NE(f.err.find(GetParam().error), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("ran"))) << "a worker started despite bad flags";
}

INSTANTIATE_TEST_SUITE_P(
    DdpRun, DdpRunBadFlags,
    ::testing::Values(
        BadFlags{{"--nproc-per-node", "0", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --nproc-per-node must be at least 1, got 0\n"},
        BadFlags{{"--nproc-per-node", "2"},
                 "ddp-run: no program to run: put it after `--`, as in ddp-run "
                 "--nproc-per-node 2 -- PROGRAM [ARGS...]\n"},
        BadFlags{{"--nproc-per-node", "2", "--"}, "ddp-run: no program to run"},
        BadFlags{{"--nproc-per-node", "2", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: no program to run"},
        BadFlags{{"--nnodes", "2", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --master-port is required when --nnodes is greater than 1"},
        BadFlags{{"--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "--", "/bin/sh",
                  "-c", "PROGRAM"},
                 "ddp-run: --node-rank must be in [0, --nnodes), got --node-rank 2 with "
                 "--nnodes 2\n"},
        BadFlags{{"--nnodes", "0", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --nnodes must be at least 1, got 0\n"},
        BadFlags{{"--master-port", "70000", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --master-port must be in 1..65535, got 70000\n"},
        BadFlags{{"--max-restarts", "-1", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --max-restarts must be at least 0, got -1\n"},
        BadFlags{{"--min-nproc", "3", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --min-nproc must be in [0, --nproc-per-node 1], got 3\n"},
        BadFlags{{"--timeout-s", "0", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --timeout-s must be greater than 0, got 0\n"},
        BadFlags{{"--job-timeout-s", "-2", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --job-timeout-s must be greater than 0, got -2\n"},
        BadFlags{{"--grace-s", "-1", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: --grace-s must be at least 0, got -1\n"},
        BadFlags{{"--nproc-per-node", "two", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: Could not convert: --nproc-per-node = two; see --help\n"},
        BadFlags{{"--nproc-per-nod", "2", "--", "/bin/sh", "-c", "PROGRAM"},
                 "ddp-run: unknown flag --nproc-per-nod; did you mean --nproc-per-node?\n"},
        BadFlags{{"--bogus"}, "ddp-run: unknown flag --bogus; see --help\n"}),
    bad_flags_name);

TEST(DdpRun, TrainsWithDdpTrain) {
  TempDir dir;
  const auto f = ddp_run({"--nproc-per-node", "2", "--", DDP_TRAIN_PATH, "--model", "mlp",
                          "--steps", "5", "--timeout-s", "60"},
                         dir);
  ASSERT_EQ(f.code, 0) << f.out << f.err;
  EXPECT_NE(f.out.find("[rank 0] ddp-train: model mlp"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("world size 2, backend gloo"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("[rank 0] ddp-train: loss "), std::string::npos) << f.out;
}

// --flight-recorder DIR reaches every worker; when rank 1 dies at step 5 the survivor dumps and
// ddp-run says where the dumps are; ddp-forensics names the rank that left none.
TEST(DdpRun, TheFlightRecorderDirReachesTheWorkersAndIsSaidOnFailure) {
  TempDir dir;
  const std::string fr = dir.file("fr");
  const auto f = ddp_run(
      {"--nproc-per-node", "2", "--flight-recorder", fr, "--", DDP_TRAIN_PATH, "--model", "mlp",
       "--steps", "20", "--timeout-s", "3", "--fail-at-step", "5", "--fail-rank", "1"},
      dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_NE(f.err.find("ddp-run: flight recorder dumps in " + fr + " (ddp-forensics " + fr +
                       " names the first divergence)\n"),
            std::string::npos)
      << f.err;
  EXPECT_TRUE(std::ifstream(fr + "/flight-rank0.json").good()) << f.err;
#ifdef DDP_FORENSICS_PATH
  const auto [out, code] =
      ddp::testing::run_command(std::string(DDP_FORENSICS_PATH) + " " + fr + " 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.rfind("rank 1 left no dump (killed, or never started)", 0), 0u) << out;
#endif
}

// Two ddp-runs on one machine as two nodes of `per_node` workers each, running `program`: rank
// 0's store (at --master-port) joins them. Node 0's result, then node 1's.
std::pair<Finished, Finished> run_two_nodes(const TempDir& dir, int per_node,
                                            const std::vector<std::string>& program) {
  const std::string port = std::to_string(ddp::launch::find_free_port());
  auto node = [&](int rank) {
    std::vector<std::string> args = {"--nproc-per-node",
                                     std::to_string(per_node),
                                     "--nnodes",
                                     "2",
                                     "--node-rank",
                                     std::to_string(rank),
                                     "--master-port",
                                     port,
                                     "--job-timeout-s",
                                     "120",
                                     "--"};
    args.insert(args.end(), program.begin(), program.end());
    return start_ddp_run(args, dir, "node" + std::to_string(rank));
  };
  const auto l0 = node(0);
  const auto l1 = node(1);
  auto f0 = wait_ddp_run(l0, 150s);
  auto f1 = wait_ddp_run(l1, 150s);
  return {std::move(f0), std::move(f1)};
}

TEST(DdpRun, TwoNodesFormOneJob) {
  TempDir dir;
  const auto [f0, f1] = run_two_nodes(
      dir, 1, {DDP_TRAIN_PATH, "--model", "mlp", "--steps", "5", "--timeout-s", "60"});
  EXPECT_EQ(f0.code, 0) << f0.out << f0.err;
  EXPECT_EQ(f1.code, 0) << f1.out << f1.err;
  EXPECT_NE(f0.out.find("[rank 0] ddp-train: model mlp"), std::string::npos) << f0.out;
  EXPECT_NE(f0.out.find("world size 2"), std::string::npos) << f0.out;
}

// Two nodes of two workers: ddp-train --dp-replicate nodes reads the node layout
// (LOCAL_WORLD_SIZE 2) and shards within each node, replicating across the two.
TEST(DdpRun, TwoNodesShardWithinANodeByTheNodeLayout) {
  TempDir dir;
  const auto [f0, f1] =
      run_two_nodes(dir, 2,
                    {DDP_TRAIN_PATH, "--model", "gpt", "--steps", "3", "--fsdp", "--fsdp-wrap",
                     "--dp-replicate", "nodes", "--timeout-s", "60"});
  EXPECT_EQ(f0.code, 0) << f0.out << f0.err;
  EXPECT_EQ(f1.code, 0) << f1.out << f1.err;
  EXPECT_NE(f0.out.find("3 units (fully_shard, hybrid: 2 replicas of 2 shards), world size 4"),
            std::string::npos)
      << f0.out;
}

}  // namespace
