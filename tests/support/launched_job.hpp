#pragma once
// A tool's job started in the background from a test (ddp-train --nproc N ...), so that the test
// can act on one of its workers mid-run (SIGSTOP, SIGKILL): the launcher's pid, its output in a
// file, its workers found by rank, and a bounded wait for its end.

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/run_command.hpp"

namespace ddp::testing {

// The names in `dir`, "." and ".." left out.
inline std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

struct LaunchedJob {
  pid_t pid = -1;   // the launcher, leader of its own process group
  std::string log;  // its stdout and stderr

  // `command` run by /bin/sh (exec'd: the launcher keeps the shell's pid), output to `log_path`.
  LaunchedJob(const std::string& command, std::string log_path) : log(std::move(log_path)) {
    const std::string line = "exec " + command + " > " + log + " 2>&1";
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own group: a job past its bound is killed whole
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~LaunchedJob() {
    if (pid > 0) wait(std::chrono::seconds(0));
  }
  LaunchedJob(const LaunchedJob&) = delete;
  LaunchedJob& operator=(const LaunchedJob&) = delete;

  std::string output() const { return read_file(log); }

  // Polls the output (bounded) until it holds `text`.
  bool wait_for_output(const std::string& text, std::chrono::seconds bound) const {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < deadline) {
      if (output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a file, bounded
    }
    return false;
  }

  // The worker (a child of the launcher) whose environment says RANK=<rank>; -1 if none. A worker
  // forked rather than exec'd (the tools on the CPU: launch::WorkerGroupOptions::fork_main) keeps
  // the launcher's environment in /proc/<pid>/environ (its own is set after the fork): then the
  // rank-th child by pid, as the launcher forks rank 0 first.
  pid_t worker(int rank) const {
    const std::string key = "RANK=" + std::to_string(rank);
    std::vector<pid_t> children;
    for (const std::string& name : names_in("/proc")) {
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string stat = read_file("/proc/" + name + "/stat");
      const size_t end = stat.rfind(") ");
      if (end == std::string::npos) continue;
      std::istringstream fields(stat.substr(end + 2));
      char state = 0;
      pid_t parent = 0;
      fields >> state >> parent;
      if (parent != pid) continue;
      children.push_back(static_cast<pid_t>(std::stoi(name)));
      std::istringstream env(read_file("/proc/" + name + "/environ"));
      bool has_rank = false;
      for (std::string entry; std::getline(env, entry, '\0');) {
        if (entry == key) return children.back();
        has_rank |= entry.rfind("RANK=", 0) == 0;
      }
      if (has_rank) children.pop_back();  // an exec'd worker of another rank
    }
    std::sort(children.begin(), children.end());
    return rank < static_cast<int>(children.size()) ? children[static_cast<size_t>(rank)] : -1;
  }

  // The launcher's wait status, waiting at most `bound`; past it the job is killed and -1
  // returned.
  int wait(std::chrono::seconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    int status = 0;
    for (;;) {
      if (::waitpid(pid, &status, WNOHANG) == pid) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit
    }
    pid = -1;
    return status;
  }
};

}  // namespace ddp::testing
