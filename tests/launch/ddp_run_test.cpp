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
#include "support/param_names.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

namespace {

using ddp::testing::TempDir;

using Clock = std::chrono::steady_clock;
using ddp::testing::read_file;
using namespace std::chrono_literals;

// Polls `done` until it holds or `bound` passes. Polling stands in for an event the test cannot
// wait on directly (a file appearing, a process vanishing); the bound keeps a bug from hanging.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds bound) {
  const auto until = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

struct Launched {
  pid_t pid = -1;
  std::string out_path, err_path;
  Clock::time_point started;
};

struct Finished {
  int code = -1;    // exit status, -1 if it did not exit normally
  int signal = 0;   // the signal that ended ddp-run itself, if any
  std::string out;  // ddp-run's stdout and stderr, kept apart
  std::string err;
  double seconds = 0;  // from launch to exit
};

// Starts ddp-run with `args`; its stdout/stderr go to files in `dir` (tag keeps two launches
// apart). `env` is added to the test's own environment.
Launched start_ddp_run(const std::vector<std::string>& args, const TempDir& dir,
                       const std::string& tag = "run",
                       const std::map<std::string, std::string>& env = {}) {
  Launched l;
  l.out_path = dir.file(tag + ".out");
  l.err_path = dir.file(tag + ".err");
  // Everything the child needs is built before fork: the test binary may have threads.
  std::vector<std::string> argv_s = {DDP_RUN_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (env.count(entry.substr(0, entry.find('='))) == 0) env_s.push_back(entry);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  l.started = Clock::now();
  l.pid = ::fork();
  if (l.pid == 0) {
    const int out = ::open(l.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(l.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return l;
}

// Waits (bounded) for ddp-run to exit. Past the bound it is killed and the test fails.
Finished wait_ddp_run(const Launched& l, std::chrono::seconds bound = 60s) {
  Finished f;
  int status = 0;
  const bool exited =
      wait_until([&] { return ::waitpid(l.pid, &status, WNOHANG) == l.pid; }, bound);
  if (!exited) {
    ::kill(l.pid, SIGKILL);
    ::waitpid(l.pid, &status, 0);
    ADD_FAILURE() << "ddp-run did not exit within " << bound.count() << " s";
  }
  f.seconds = std::chrono::duration<double>(Clock::now() - l.started).count();
  f.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  f.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  f.out = read_file(l.out_path);
  f.err = read_file(l.err_path);
  return f;
}

Finished ddp_run(const std::vector<std::string>& args, const TempDir& dir,
                 const std::map<std::string, std::string>& env = {}) {
  return wait_ddp_run(start_ddp_run(args, dir, "run", env));
}

// `flags -- /bin/sh -c script`
std::vector<std::string> sh(std::vector<std::string> flags, const std::string& script) {
  flags.insert(flags.end(), {"--", "/bin/sh", "-c", script});
  return flags;
}

// Shell snippet: the worker records its pid as $D/pid.$RANK, atomically (rename).
std::string record_pid(const TempDir& dir) {
  return "D='" + dir.str() + "'; echo $$ > \"$D/pid.$RANK.tmp\" && mv \"$D/pid.$RANK.tmp\" " +
         "\"$D/pid.$RANK\"; ";
}

// Waits for every rank's pid file and returns the pids (empty on timeout).
std::vector<pid_t> wait_for_pids(const TempDir& dir, const std::vector<int>& ranks) {
  const bool all = wait_until(
      [&] {
        for (int r : ranks) {
          if (!std::filesystem::exists(dir.file("pid." + std::to_string(r)))) return false;
        }
        return true;
      },
      30s);
  if (!all) return {};
  std::vector<pid_t> pids;
  for (int r : ranks) pids.push_back(std::stoi(read_file(dir.file("pid." + std::to_string(r)))));
  return pids;
}

// Gone: no such process, or a zombie nobody reaps (this container's init may not reap orphans).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state == 'Z' || state == 'X';
}

// Kills what a failed test left behind, so one failure does not leave sleeping workers.
void reap_leftovers(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (!process_gone(p)) ::kill(p, SIGKILL);
  }
}

// A FIFO a worker blocks on (`read x < fifo`) until the test releases it: the worker proceeds on
// the test's event, not on a timer.
std::string make_gate(const TempDir& dir) {
  const std::string path = dir.file("gate");
  if (::mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
  return path;
}

// Opens and closes the FIFO's write end: the blocked reader sees end of file. Non-blocking open
// fails (ENXIO) until the reader is there, so it is retried within a bound.
bool release_gate(const std::string& gate) {
  return wait_until(
      [&] {
        const int fd = ::open(gate.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd < 0) return false;
        ::close(fd);
        return true;
      },
      30s);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

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

TEST(DdpRun, RestartsTheGroupAfterAFailure) {
  TempDir dir;
  const auto f = ddp_run(sh({"--nproc-per-node", "2", "--max-restarts", "1"},
                            "echo \"attempt $DDP_RESTART_COUNT\"; "
                            "if [ $DDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 5; fi"),
                         dir);
  EXPECT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 5\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("ddp-run: restarting the group (restart 1 of 1) after rank 1 exited with "
                       "code 5\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.out.find("[rank 0] attempt 1\n"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("[rank 1] attempt 1\n"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("attempt 2"), std::string::npos) << f.out;
}

TEST(DdpRun, GivesUpWhenTheRestartsAreSpent) {
  TempDir dir;
  const auto f =
      ddp_run(sh({"--max-restarts", "2"}, "echo \"attempt $DDP_RESTART_COUNT\"; exit 4"), dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_EQ(count(f.err, "ddp-run: rank 0 exited with code 4\n"), 3) << f.err;
  EXPECT_NE(f.err.find("(restart 1 of 2)"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("(restart 2 of 2)"), std::string::npos) << f.err;
  EXPECT_EQ(f.out, "[rank 0] attempt 0\n[rank 0] attempt 1\n[rank 0] attempt 2\n");
}

// The launcher channel (DDP_LAUNCHER_FD) carries the step a worker reached: a worker that fails
// at the same step again after a restart is a restart loop, and the launcher stops there instead
// of spending every restart on it.
TEST(DdpRun, StopsARestartLoopAtTheSameFailureAtTheSameStep) {
  TempDir dir;
  const auto f =
      ddp_run(sh({"--max-restarts", "5"},
                 "echo \"attempt $DDP_RESTART_COUNT\"; echo ready >/dev/fd/$DDP_LAUNCHER_FD; "
                 "echo 'step 7' >/dev/fd/$DDP_LAUNCHER_FD; exit 4"),
              dir);
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_EQ(count(f.err, "ddp-run: rank 0 exited with code 4 at step 7\n"), 2) << f.err;
  EXPECT_NE(f.err.find("ddp-run: restarting the group (restart 1 of 5) after rank 0 exited with "
                       "code 4 at step 7\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find("ddp-run: not restarting: rank 0 exited with code 4 at step 7 again, as in "
                       "the attempt before (a restart loop: the same failure at the same step)\n"),
            std::string::npos)
      << f.err;
  EXPECT_EQ(f.out, "[rank 0] attempt 0\n[rank 0] attempt 1\n");
}

// --min-nproc: a worker that fails at start-up (never "ready" on the launcher channel) on a
// restart has its slot dropped; the others go on as a smaller world, renumbered, each still
// finding its own GPU (CUDA_VISIBLE_DEVICES names the slots left), told the world it started with.
TEST(DdpRun, GoesOnWithFewerWorkersWhenASlotFailsAtStartUp) {
  TempDir dir;
  const auto f = ddp_run(
      sh({"--nproc-per-node", "3", "--max-restarts", "2", "--min-nproc", "2"},
         "if [ $DDP_RESTART_COUNT = 1 ] && [ $LOCAL_RANK = 1 ]; then exit 4; fi; "
         "echo ready >/dev/fd/$DDP_LAUNCHER_FD; "
         "if [ $DDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 9; fi; "
         "echo \"attempt $DDP_RESTART_COUNT world $WORLD_SIZE of $DDP_STARTED_WORLD_SIZE local "
         "$LOCAL_RANK/$LOCAL_WORLD_SIZE devices ${CUDA_VISIBLE_DEVICES:-all}\""),
      dir);
  EXPECT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 9\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("ddp-run: rank 1 exited with code 4\nddp-run: rank 1 (slot 1) failed at "
                       "start-up; going on with 2 workers (--min-nproc 2)\nddp-run: restarting "
                       "the group (restart 2 of 2) after rank 1 exited with code 4\n"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.out.find("[rank 0] attempt 2 world 2 of 3 local 0/2 devices 0,2\n"),
            std::string::npos)
      << f.out;
  EXPECT_NE(f.out.find("[rank 1] attempt 2 world 2 of 3 local 1/2 devices 0,2\n"),
            std::string::npos)
      << f.out;
  EXPECT_EQ(count(f.out, "attempt 2"), 2) << f.out;
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
        BadFlags{{"--nproc-per-node", "two", "--", "/bin/sh", "-c", "PROGRAM"}, "--nproc-per-node"},
        BadFlags{{"--bogus", "--", "/bin/sh", "-c", "PROGRAM"}, "--bogus"}),
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

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The restart test: rank 1 dies at step 7 (after the step-5 checkpoint); ddp-run stops
// rank 0, restarts the group with DDP_RESTART_COUNT=1, the workers resume from step 5, and the
// final parameters equal an uninterrupted run's, bit for bit.
TEST(DdpRun, MaxRestartsResumesFromTheCheckpointAndEqualsAnUninterruptedRun) {
  TempDir dir;
  const std::vector<std::string> train = {DDP_TRAIN_PATH, "--model",     "mlp", "--steps",
                                          "10",           "--timeout-s", "60"};
  auto args = [&](std::vector<std::string> launcher, std::vector<std::string> extra) {
    launcher.push_back("--");
    launcher.insert(launcher.end(), train.begin(), train.end());
    launcher.insert(launcher.end(), extra.begin(), extra.end());
    return launcher;
  };
  const auto straight = ddp_run(
      args({"--nproc-per-node", "2"}, {"--save-weights", dir.file("straight.safetensors")}), dir);
  ASSERT_EQ(straight.code, 0) << straight.out << straight.err;
  const auto restarted = wait_ddp_run(
      start_ddp_run(
          args({"--nproc-per-node", "2", "--max-restarts", "1"},
               {"--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "5", "--fail-at-step",
                "7", "--fail-rank", "1", "--save-weights", dir.file("restarted.safetensors")}),
          dir, "restart"),
      150s);
  ASSERT_EQ(restarted.code, 0) << restarted.out << restarted.err;
  const std::string all = restarted.out + restarted.err;
  EXPECT_NE(all.find("ddp-run: rank 1 exited with code 3"), std::string::npos) << all;
  EXPECT_NE(all.find("ddp-run: restarting the group (restart 1 of 1)"), std::string::npos) << all;
  EXPECT_NE(all.find("[rank 0] ddp-train: resumed from " + dir.file("ckpt") + "/step-5 at step 5"),
            std::string::npos)
      << all;
  const std::string a = file_bytes(dir.file("straight.safetensors"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == file_bytes(dir.file("restarted.safetensors")))
      << "the restarted run's final parameters differ from the uninterrupted run's";
}

// Two ddp-runs on one machine as two nodes: rank 0's store (at --master-port) joins them.
TEST(DdpRun, TwoNodesFormOneJob) {
  TempDir dir;
  const std::string port = std::to_string(ddp::launch::find_free_port());
  auto node = [&](int rank) {
    return start_ddp_run(
        {"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", std::to_string(rank),
         "--master-port", port, "--job-timeout-s", "120", "--", DDP_TRAIN_PATH, "--model", "mlp",
         "--steps", "5", "--timeout-s", "60"},
        dir, "node" + std::to_string(rank));
  };
  const auto l0 = node(0);
  const auto l1 = node(1);
  const auto f0 = wait_ddp_run(l0, 150s);
  const auto f1 = wait_ddp_run(l1, 150s);
  EXPECT_EQ(f0.code, 0) << f0.out << f0.err;
  EXPECT_EQ(f1.code, 0) << f1.out << f1.err;
  EXPECT_NE(f0.out.find("[rank 0] ddp-train: model mlp"), std::string::npos) << f0.out;
  EXPECT_NE(f0.out.find("world size 2"), std::string::npos) << f0.out;
}

}  // namespace
