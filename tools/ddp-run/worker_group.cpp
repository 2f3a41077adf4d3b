#include "worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "line_relay.hpp"

extern char** environ;

namespace ddp::run {
namespace {

// Self-pipe: the handlers only record and write a byte, so poll() in the main loop wakes at once
// for a signal or a child's exit instead of polling waitpid on a timer.
int g_wake[2] = {-1, -1};
volatile sig_atomic_t g_signal = 0;        // the first SIGINT/SIGTERM/SIGHUP received
volatile sig_atomic_t g_signal_count = 0;  // how many of those; a second one means "kill now"

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    if (g_signal == 0) g_signal = sig;
    g_signal_count = g_signal_count + 1;
  }
  const char byte = 1;
  (void)!::write(g_wake[1], &byte, 1);  // a full pipe already holds a wake-up
  errno = saved;
}

sigset_t handled_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kHandled) sigaddset(&set, sig);
  return set;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

std::string describe_signal(int sig) {
  const char* name = ::strsignal(sig);
  return std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
}

// The worker's environment: ddp-run's own, with the launcher variables replaced. Built before
// fork so that the child only calls async-signal-safe functions until exec.
std::vector<std::string> worker_environment(const GroupOptions& o, int local_rank) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"DDP_RESTART_COUNT", std::to_string(o.restart_count)},
  };
  std::vector<std::string> env;
  bool has_omp = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    has_omp = has_omp || key == "OMP_NUM_THREADS";
    const bool replaced =
        std::any_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  // As torchrun: N workers each using every core oversubscribe the machine N times over.
  if (!has_omp && o.nproc_per_node > 1) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;   // > 0 until reaped; also the worker's process group id
  int out_fd = -1;  // read ends of the worker's stdout/stderr pipes; -1 once closed
  int err_fd = -1;
  std::unique_ptr<LineRelay> out, err;
};

[[noreturn]] void exec_worker(const GroupOptions& o, const std::vector<std::string>& env, int out_w,
                              int err_w, pid_t launcher) {
  // Own process group: see [Note: worker process groups] in worker_group.hpp.
  ::setpgid(0, 0);
  for (int sig : kHandled) ::signal(sig, SIG_DFL);
  const sigset_t set = handled_set();
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  // Die with the launcher, even when it is SIGKILLed: no orphan keeps a port or a GPU.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl took effect
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  ::dup2(out_w, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy only
  ::dup2(err_w, STDERR_FILENO);
  std::vector<char*> args, envp;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  ::execvpe(args[0], args.data(), envp.data());
  const int err = errno;
  const char* parts[] = {"ddp-run: cannot run ", args[0], ": ", std::strerror(err), "\n"};
  for (const char* p : parts) (void)!::write(STDERR_FILENO, p, std::strlen(p));
  ::_exit(127);  // the shell's "command not found"
}

class GroupRunner {
 public:
  explicit GroupRunner(const GroupOptions& o) : o_(o) {}

  GroupResult run() {
    if (g_signal != 0) return signalled();  // a signal between attempts: start nothing
    start_workers();
    while (
        std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.pid > 0; })) {
      handle_signals();
      handle_deadlines();
      wait_for_events();
      reap_exited();
    }
    return result_;
  }

 private:
  GroupResult signalled() {
    GroupResult r;
    r.kind = GroupResult::Kind::kSignalled;
    r.signal = g_signal;
    return r;
  }

  void start_workers() {
    const pid_t self = ::getpid();
    workers_.resize(o_.nproc_per_node);
    for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
      Worker& w = workers_[lr];
      w.local_rank = lr;
      w.rank = o_.node_rank * o_.nproc_per_node + lr;
      const std::string prefix = "[rank " + std::to_string(w.rank) + "] ";
      w.out = std::make_unique<LineRelay>(prefix, STDOUT_FILENO);
      w.err = std::make_unique<LineRelay>(prefix, STDERR_FILENO);
      const auto env = worker_environment(o_, lr);
      int out_pipe[2], err_pipe[2];
      if (::pipe2(out_pipe, O_CLOEXEC) != 0) fail("ddp-run: pipe");
      if (::pipe2(err_pipe, O_CLOEXEC) != 0) fail("ddp-run: pipe");
      // Signals stay blocked across fork: a signal landing between fork and exec must not run
      // our handler in the child (it would write into the launcher's wake pipe).
      const sigset_t set = handled_set();
      sigset_t old;
      ::sigprocmask(SIG_BLOCK, &set, &old);
      const pid_t pid = ::fork();
      if (pid == 0) exec_worker(o_, env, out_pipe[1], err_pipe[1], self);
      const int fork_errno = errno;
      if (pid > 0) ::setpgid(pid, pid);  // also here, so kill(-pid) works before the child runs
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      if (pid < 0) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        errno = fork_errno;
        // Workers already started are stopped by the caller's exit (PR_SET_PDEATHSIG).
        fail("ddp-run: fork");
      }
      w.pid = pid;
      w.out_fd = out_pipe[0];
      w.err_fd = err_pipe[0];
      ::fcntl(w.out_fd, F_SETFL, O_NONBLOCK);
      ::fcntl(w.err_fd, F_SETFL, O_NONBLOCK);
    }
  }

  // Sends `sig` to the process group of every worker not yet reaped. An unreaped worker's pid
  // cannot be reused, so its group id still names only its own processes.
  void signal_workers(int sig) {
    for (const Worker& w : workers_) {
      if (w.pid > 0) ::kill(-w.pid, sig);
    }
  }

  void stop(int sig) {
    signal_workers(sig);
    if (!stopping_) kill_at_ = Clock::now() + o_.grace;
    stopping_ = true;
  }

  void handle_signals() {
    const int count = g_signal_count;
    if (count == handled_signals_) return;
    if (handled_signals_ == 0) {
      result_.kind = GroupResult::Kind::kSignalled;
      result_.signal = g_signal;
      write_all(STDERR_FILENO, "ddp-run: got signal " + describe_signal(g_signal) +
                                   "; forwarding it to the workers\n");
      stop(g_signal);
    } else {
      write_all(STDERR_FILENO, "ddp-run: signalled again; killing the workers\n");
      signal_workers(SIGKILL);
      kill_at_.reset();
    }
    handled_signals_ = count;
  }

  void handle_deadlines() {
    const auto now = Clock::now();
    if (o_.deadline && now >= *o_.deadline && !timed_out_) {
      timed_out_ = true;
      if (result_.kind == GroupResult::Kind::kSucceeded) {
        result_.kind = GroupResult::Kind::kTimedOut;
      }
      write_all(STDERR_FILENO, "ddp-run: timed out (--timeout-s); stopping the workers\n");
      stop(SIGTERM);
    }
    if (kill_at_ && now >= *kill_at_) {
      signal_workers(SIGKILL);
      kill_at_.reset();
    }
  }

  void wait_for_events() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, bool>> owners;  // (worker, is_stdout) per fds entry after 0
    fds.push_back({g_wake[0], POLLIN, 0});
    for (Worker& w : workers_) {
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        owners.emplace_back(&w, true);
      }
      if (w.err_fd >= 0) {
        fds.push_back({w.err_fd, POLLIN, 0});
        owners.emplace_back(&w, false);
      }
    }
    // Every exit and signal wakes poll through the self-pipe; the cap is only for the deadlines.
    auto wait = std::chrono::milliseconds(1000);
    const auto now = Clock::now();
    for (const auto& t : {kill_at_, timed_out_ ? std::nullopt : o_.deadline}) {
      if (t) {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*t - now));
      }
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) fail("ddp-run: poll");
    if (n <= 0) return;
    if (fds[0].revents != 0) {
      char buf[64];
      while (::read(g_wake[0], buf, sizeof(buf)) > 0) {
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [w, is_out] = owners[i - 1];
      pump(*w, is_out, /*drain=*/false);
    }
  }

  // Reads what the pipe holds now (one read, or everything when draining) into the relay; closes
  // the pipe at end of file.
  void pump(Worker& w, bool is_out, bool drain) {
    int& fd = is_out ? w.out_fd : w.err_fd;
    LineRelay& relay = is_out ? *w.out : *w.err;
    char buf[64 * 1024];
    // A drain is bounded: a process the worker left behind could keep the pipe busy forever.
    for (int reads = 0; fd >= 0 && reads < (drain ? 64 : 1); ++reads) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n > 0) {
        relay.feed(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      relay.finish();  // end of file, or an error we cannot recover from
      ::close(fd);
      fd = -1;
    }
  }

  void close_streams(Worker& w) {
    for (bool is_out : {true, false}) {
      pump(w, is_out, /*drain=*/true);
      int& fd = is_out ? w.out_fd : w.err_fd;
      (is_out ? *w.out : *w.err).finish();
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }

  void reap_exited() {
    for (Worker& w : workers_) {
      if (w.pid <= 0) continue;
      // WNOWAIT: look at the exit but leave the zombie, which keeps the pid (and so the process
      // group id) ours while we sweep the group below.
      siginfo_t info{};
      if (::waitid(P_PID, w.pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != w.pid) {
        continue;
      }
      const bool signaled = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
      const int code = info.si_status;
      const bool failed = signaled || code != 0;
      if (failed && !stopping_) {
        result_.kind = GroupResult::Kind::kWorkerFailed;
        result_.first_failure = GroupResult::Failure{w.rank, signaled, code};
        write_all(STDERR_FILENO, "ddp-run: rank " + std::to_string(w.rank) +
                                     (signaled ? " was killed by signal " + describe_signal(code)
                                               : " exited with code " + std::to_string(code)) +
                                     "\n");
        stop(SIGTERM);
      }
      // What a failed or stopped worker started dies with it; a worker that finished cleanly
      // while the others run keeps its helpers (they may still be flushing its output).
      if (failed || stopping_) ::kill(-w.pid, SIGKILL);
      int status = 0;
      while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.pid = -1;
      close_streams(w);
    }
  }

  const GroupOptions& o_;
  std::vector<Worker> workers_;
  GroupResult result_;
  bool stopping_ = false;  // SIGTERM (or the forwarded signal) has gone to every worker
  bool timed_out_ = false;
  std::optional<Clock::time_point> kill_at_;  // when the stopping workers get SIGKILL
  int handled_signals_ = 0;                   // g_signal_count already acted upon
};

}  // namespace

void install_signal_handlers() {
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) fail("ddp-run: pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int sig : kHandled) ::sigaction(sig, &sa, nullptr);
  // A parent may have left them blocked (the mask is inherited); we must see them all.
  const sigset_t set = handled_set();
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

int received_signal() { return g_signal; }

GroupResult run_worker_group(const GroupOptions& options) { return GroupRunner(options).run(); }

}  // namespace ddp::run
