#pragma once
// Driving the real ddp-run binary from a test (tests/launch/ddp_run_*_test.cpp): start it with
// its output in files, wait for it (bounded), small /bin/sh workers, and the bounded polls and
// process checks the tests share. Needs DDP_RUN_PATH.

#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

namespace ddp::testing {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Polls `done` until it holds or `bound` passes. Polling stands in for an event the test cannot
// wait on directly (a file appearing, a process vanishing); the bound keeps a bug from hanging.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds bound) {
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
inline Launched start_ddp_run(const std::vector<std::string>& args, const TempDir& dir,
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
inline Finished wait_ddp_run(const Launched& l, std::chrono::seconds bound = 60s) {
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

inline Finished ddp_run(const std::vector<std::string>& args, const TempDir& dir,
                        const std::map<std::string, std::string>& env = {}) {
  return wait_ddp_run(start_ddp_run(args, dir, "run", env));
}

// `flags -- /bin/sh -c script`
inline std::vector<std::string> sh(std::vector<std::string> flags, const std::string& script) {
  flags.insert(flags.end(), {"--", "/bin/sh", "-c", script});
  return flags;
}

// Shell snippet: the worker records its pid as $D/pid.$RANK, atomically (rename).
inline std::string record_pid(const TempDir& dir) {
  return "D='" + dir.str() + "'; echo $$ > \"$D/pid.$RANK.tmp\" && mv \"$D/pid.$RANK.tmp\" " +
         "\"$D/pid.$RANK\"; ";
}

// Waits for every rank's pid file and returns the pids (empty on timeout).
inline std::vector<pid_t> wait_for_pids(const TempDir& dir, const std::vector<int>& ranks) {
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
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state == 'Z' || state == 'X';
}

// Kills what a failed test left behind, so one failure does not leave sleeping workers.
inline void reap_leftovers(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (!process_gone(p)) ::kill(p, SIGKILL);
  }
}

// A FIFO a worker blocks on (`read x < fifo`) until the test releases it: the worker proceeds on
// the test's event, not on a timer.
inline std::string make_gate(const TempDir& dir) {
  const std::string path = dir.file("gate");
  if (::mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
  return path;
}

// Opens and closes the FIFO's write end: the blocked reader sees end of file. Non-blocking open
// fails (ENXIO) until the reader is there, so it is retried within a bound.
inline bool release_gate(const std::string& gate) {
  return wait_until(
      [&] {
        const int fd = ::open(gate.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd < 0) return false;
        ::close(fd);
        return true;
      },
      30s);
}

inline int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace ddp::testing
