#include "ddp/launch/worker_group.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "ddp/comm/launcher_channel.hpp"
#include "ddp/files/posix_file.hpp"
#include "ddp/launch/free_port.hpp"
#include "ddp/launch/line_relay.hpp"

extern char** environ;

namespace ddp::launch {
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

// Whether `pid` is stopped (SIGSTOP, a terminal's stop, a tracer's): /proc/<pid>/stat's state,
// the first field after the parenthesised command name (which may itself hold ") ").
bool is_stopped(pid_t pid) {
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone already
  char buffer[1024];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  ::close(fd);
  if (n <= 0) return false;
  const std::string stat(buffer, static_cast<size_t>(n));
  const size_t end = stat.rfind(") ");
  return end != std::string::npos && end + 2 < stat.size() &&
         (stat[end + 2] == 'T' || stat[end + 2] == 't');
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// Installs the handlers once per process; they stay for its life (a launcher exits after its
// group).
void install_signal_handlers() {
  if (g_wake[0] >= 0) return;
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) fail("ddp: launcher: pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int sig : kHandled) ::sigaction(sig, &sa, nullptr);
  // A parent may have left them blocked (the mask is inherited); we must see them all.
  const sigset_t set = handled_set();
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

std::string describe_signal(int sig) {
  const char* name = ::strsignal(sig);
  return std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
}

// One attempt's settings: the options plus what changes between attempts.
struct Attempt {
  const WorkerGroupOptions& o;
  uint16_t master_port = 0;
  int restart_count = 0;
  std::optional<Clock::time_point> deadline;
  // The local slots this attempt runs, in order: worker i runs in slots[i]. Every slot until one
  // is dropped (WorkerGroupOptions::min_nproc).
  std::vector<int> slots;
};

// CUDA_VISIBLE_DEVICES for the slots left: the inherited list's entries at those slots (or the
// slot numbers themselves), so that LOCAL_RANK i still finds its GPU at index i.
std::string visible_devices(const std::vector<int>& slots) {
  std::vector<std::string> inherited;
  if (const char* list = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string rest = list;
    for (size_t at = 0; at <= rest.size();) {
      const size_t comma = std::min(rest.find(',', at), rest.size());
      inherited.push_back(rest.substr(at, comma - at));
      at = comma + 1;
    }
  }
  std::string out;
  for (int slot : slots) {
    const auto s = static_cast<size_t>(slot);
    out += (out.empty() ? "" : ",") + (s < inherited.size() ? inherited[s] : std::to_string(slot));
  }
  return out;
}

// The worker's environment: the launcher's own, with the launcher variables replaced. Built
// before fork so that the child only calls async-signal-safe functions until exec.
std::vector<std::string> worker_environment(const Attempt& a, int local_rank, int channel_fd) {
  const WorkerGroupOptions& o = a.o;
  const int nproc = static_cast<int>(a.slots.size());
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(o.node_rank * nproc + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * nproc)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(a.master_port)},
      {"DDP_RESTART_COUNT", std::to_string(a.restart_count)},
      {comm::kLauncherFdVar, std::to_string(channel_fd)},
      // The world the job started with: a smaller one after a dropped slot (min_nproc) keeps
      // what depends on it, the global batch.
      {"DDP_STARTED_WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
  };
  if (nproc < o.nproc_per_node) ours.emplace_back("CUDA_VISIBLE_DEVICES", visible_devices(a.slots));
  const auto is_ours = [&](const std::string& key) {
    return std::any_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == key; });
  };
  bool has_omp = o.env.count("OMP_NUM_THREADS") > 0;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    has_omp = has_omp || key == "OMP_NUM_THREADS";
    if (!is_ours(key) && o.env.count(key) == 0) env.push_back(entry);
  }
  for (const auto& [k, v] : o.env) {
    if (!is_ours(k)) env.push_back(k + "=" + v);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  // As torchrun: N workers each using every core oversubscribe the machine N times over.
  if (!has_omp && nproc > 1) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

// [Note: a forked worker's threads] An exec'd worker's BLAS and OpenMP read OMP_NUM_THREADS
// (worker_env sets 1 for several workers) when they load; a forked one (fork_main) inherits the
// launcher's, loaded with the launcher's environment (every core), so its sums would run in
// another order than an exec'd worker's: ddp-bench's bit-for-bit parity with PyTorch failed by
// 1.8e-5 after 5 Adam steps at world 2. So before it forks, the launcher takes the workers'
// count itself, through whichever of the libraries' setters are loaded (found by name: the
// launcher links none of them). It computes nothing of its own; a test binary's oracles are
// exact either way.
void use_worker_threads(const std::vector<std::string>& env) {
  int threads = 0;
  for (const std::string& e : env) {
    if (e.rfind("OMP_NUM_THREADS=", 0) == 0) threads = std::atoi(e.c_str() + 16);
  }
  if (threads <= 0) return;
  for (const char* name :
       {"openblas_set_num_threads", "omp_set_num_threads", "mkl_set_num_threads"}) {
    if (auto* set = reinterpret_cast<void (*)(int)>(::dlsym(RTLD_DEFAULT, name))) set(threads);
  }
}

struct Worker {
  WorkerExit exit;  // exit.rank is set at start, the rest when reaped
  pid_t pid = -1;   // > 0 until reaped; also the worker's process group id
  int out_fd = -1;  // read ends of the worker's stdout/stderr pipes; -1 once closed (or unused)
  int err_fd = -1;
  std::unique_ptr<LineRelay> out, err;
  int channel_fd = -1;  // read end of its launcher channel; -1 once closed
  std::string channel;  // what the channel sent after its last whole line
};

// Between fork and exec: async-signal-safe calls only (with fork_main, the worker's own code runs
// after them instead of exec).
[[noreturn]] void exec_worker(const WorkerGroupOptions& o, const std::vector<std::string>& env,
                              int out_w, int err_w, int channel_w, pid_t launcher) {
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
  if (out_w >= 0) ::dup2(out_w, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy only
  if (err_w >= 0) ::dup2(err_w, STDERR_FILENO);
  ::fcntl(channel_w, F_SETFD, 0);  // the launcher channel crosses exec (DDP_LAUNCHER_FD)
  if (o.fork_main) {
    // No exec: the worker's environment replaces the launcher's, the function runs here, and
    // the process ends without the launcher's exit handlers and destructors (they are not ours).
    ::clearenv();
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const int code = o.fork_main();
    std::fflush(nullptr);
    ::_exit(code);
  }
  std::vector<char*> args, envp;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  ::execvpe(args[0], args.data(), envp.data());
  const int err = errno;
  const char* parts[] = {o.name.c_str(), ": cannot run ", args[0], ": ", std::strerror(err), "\n"};
  for (const char* p : parts) (void)files::write_all(STDERR_FILENO, p, std::strlen(p));
  ::_exit(127);  // the shell's "command not found"
}

// Our own lines go out whole, in one write, like the workers' (see line_relay.hpp).
void say(const WorkerGroupOptions& o, const std::string& message) {
  const std::string line = o.name + ": " + message + "\n";
  (void)files::write_all(STDERR_FILENO, line.data(), line.size());
}

// One attempt: start, relay, stop, reap.
class GroupRunner {
 public:
  explicit GroupRunner(const Attempt& a) : a_(a), o_(a.o) {}

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
    for (const Worker& w : workers_) result_.workers.push_back(w.exit);
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
    const int nproc = static_cast<int>(a_.slots.size());
    workers_.resize(nproc);
    for (int lr = 0; lr < nproc; ++lr) {
      Worker& w = workers_[lr];
      w.exit.rank = o_.node_rank * nproc + lr;
      w.exit.slot = a_.slots[lr];
      // The launcher channel: non-blocking at both ends (a worker's line never waits for us).
      int channel[2] = {-1, -1};
      if (::pipe2(channel, O_CLOEXEC | O_NONBLOCK) != 0) fail(o_.name + ": pipe");
      const auto env = worker_environment(a_, lr, channel[1]);
      int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
      if (o_.relay_output) {
        const std::string prefix = "[rank " + std::to_string(w.exit.rank) + "] ";
        const bool raw = w.exit.rank == 0 && !o_.prefix_rank0_stdout;
        w.out = std::make_unique<LineRelay>(raw ? "" : prefix, STDOUT_FILENO);
        w.err = std::make_unique<LineRelay>(prefix, STDERR_FILENO);
        if (::pipe2(out_pipe, O_CLOEXEC) != 0) fail(o_.name + ": pipe");
        if (::pipe2(err_pipe, O_CLOEXEC) != 0) fail(o_.name + ": pipe");
      }
      // Signals stay blocked across fork: a signal landing between fork and exec must not run
      // our handler in the child (it would write into the launcher's wake pipe).
      const sigset_t set = handled_set();
      sigset_t old;
      ::sigprocmask(SIG_BLOCK, &set, &old);
      // A forked worker flushes its stdio at the end: what our buffers hold now would go out twice.
      if (o_.fork_main) {
        std::fflush(nullptr);
        use_worker_threads(env);
      }
      const pid_t pid = ::fork();
      if (pid == 0) exec_worker(o_, env, out_pipe[1], err_pipe[1], channel[1], self);
      const int fork_errno = errno;
      if (pid > 0) ::setpgid(pid, pid);  // also here, so kill(-pid) works before the child runs
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      for (int fd : {out_pipe[1], err_pipe[1], channel[1]}) {
        if (fd >= 0) ::close(fd);
      }
      if (pid < 0) {
        for (int fd : {out_pipe[0], err_pipe[0], channel[0]}) {
          if (fd >= 0) ::close(fd);
        }
        errno = fork_errno;
        // Workers already started are stopped by the caller's exit (PR_SET_PDEATHSIG).
        fail(o_.name + ": fork");
      }
      w.pid = pid;
      w.out_fd = out_pipe[0];
      w.err_fd = err_pipe[0];
      w.channel_fd = channel[0];
      for (int fd : {w.out_fd, w.err_fd}) {
        if (fd >= 0) ::fcntl(fd, F_SETFL, O_NONBLOCK);
      }
    }
  }

  // Sends `sig` to the process group of every worker not yet reaped. An unreaped worker's pid
  // cannot be reused, so its group id still names only its own processes.
  void signal_workers(int sig) {
    for (Worker& w : workers_) {
      if (w.pid <= 0) continue;
      // Asked before the signal: SIGKILL would end the stop itself.
      const bool stopped = is_stopped(w.pid);
      ::kill(-w.pid, sig);
      // A stopped worker (SIGSTOP, a debugger's stop) acts on nothing until continued: without
      // this it would outlive the grace and take SIGKILL, `grace` after the failure it caused.
      // Only a stopped one: its flight recorder notes the SIGCONT, which tells ddp-forensics the
      // rank was stopped.
      if (stopped) ::kill(-w.pid, SIGCONT);
      w.exit.killed_by_launcher = true;
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
      say(o_, "got signal " + describe_signal(g_signal) + "; forwarding it to the workers");
      stop(g_signal);
    } else {
      say(o_, "signalled again; killing the workers");
      signal_workers(SIGKILL);
      kill_at_.reset();
    }
    handled_signals_ = count;
  }

  void handle_deadlines() {
    const auto now = Clock::now();
    if (a_.deadline && now >= *a_.deadline && !timed_out_) {
      timed_out_ = true;
      if (result_.kind == GroupResult::Kind::kSucceeded) {
        result_.kind = GroupResult::Kind::kTimedOut;
      }
      say(o_, "timed out (" + o_.timeout_source + "); stopping the workers");
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
    fds.push_back({g_wake[0], POLLIN, 0});         // -1 without forwarding: poll skips it
    std::vector<Worker*> listening;                // the channels, after the output pipes
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
    for (Worker& w : workers_) {
      if (w.channel_fd >= 0) {
        fds.push_back({w.channel_fd, POLLIN, 0});
        listening.push_back(&w);
      }
    }
    // With the handlers, every exit and signal wakes poll through the self-pipe and the cap is
    // only for the deadlines. Without them (a host keeping its own SIGCHLD), an exit shows as
    // end of file on the pipes or, failing that, at the next 20 ms look: polling, not
    // synchronisation, since waitpid has no timeout.
    auto wait = std::chrono::milliseconds(g_wake[0] >= 0 ? 1000 : 20);
    const auto now = Clock::now();
    for (const auto& t : {kill_at_, timed_out_ ? std::nullopt : a_.deadline}) {
      if (t) {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*t - now));
      }
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) fail(o_.name + ": poll");
    if (n <= 0) return;
    if (fds[0].revents != 0) {
      char buf[64];
      while (::read(g_wake[0], buf, sizeof(buf)) > 0) {
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (i > owners.size()) {
        listen(*listening[i - 1 - owners.size()]);
        continue;
      }
      auto [w, is_out] = owners[i - 1];
      pump(*w, is_out, /*drain=*/false);
    }
  }

  // Reads the worker's launcher channel: "ready" and "step N" lines (comm/launcher_channel.hpp).
  void listen(Worker& w) {
    char buf[4096];
    for (;;) {
      if (w.channel_fd < 0) return;
      const ssize_t n = ::read(w.channel_fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (n <= 0) {
        ::close(w.channel_fd);
        w.channel_fd = -1;
        return;
      }
      w.channel.append(buf, static_cast<size_t>(n));
      for (size_t end; (end = w.channel.find('\n')) != std::string::npos;) {
        const std::string line = w.channel.substr(0, end);
        w.channel.erase(0, end + 1);
        if (line == "ready") w.exit.ready = true;
        if (line.rfind("step ", 0) == 0) w.exit.step = std::atoll(line.c_str() + 5);
      }
    }
  }

  // Reads what the pipe holds now (one read, or everything when draining) into the relay; closes
  // the pipe at end of file.
  void pump(Worker& w, bool is_out, bool drain) {
    int& fd = is_out ? w.out_fd : w.err_fd;
    if (fd < 0) return;
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
    if (!o_.relay_output) return;
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
      listen(w);  // its last step and readiness, before its exit is described
      const bool signaled = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
      const int code = info.si_status;
      const bool failed = signaled || code != 0;
      w.exit.signaled = signaled;
      w.exit.signal = signaled ? code : 0;
      w.exit.exit_code = signaled ? -1 : code;
      if (failed && !stopping_) {
        result_.kind = GroupResult::Kind::kWorkerFailed;
        result_.first_failure = w.exit;
        say(o_, describe_exit(w.exit));
        const bool stopped_before = w.exit.killed_by_launcher;
        stop(SIGTERM);  // the others; this one has exited already
        w.exit.killed_by_launcher = stopped_before;
      }
      // What a failed or stopped worker started dies with it; a worker that finished cleanly
      // while the others run keeps its helpers (they may still be flushing its output).
      if (failed || stopping_) ::kill(-w.pid, SIGKILL);
      int status = 0;
      while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.pid = -1;
      close_streams(w);
      if (w.channel_fd >= 0) ::close(w.channel_fd);
      w.channel_fd = -1;
    }
  }

  const Attempt& a_;
  const WorkerGroupOptions& o_;
  std::vector<Worker> workers_;
  GroupResult result_;
  bool stopping_ = false;  // SIGTERM (or the forwarded signal) has gone to every worker
  bool timed_out_ = false;
  std::optional<Clock::time_point> kill_at_;  // when the stopping workers get SIGKILL
  int handled_signals_ = 0;                   // g_signal_count already acted upon
};

void check_options(const WorkerGroupOptions& o) {
  const auto bad = [&](const std::string& what) {
    throw std::invalid_argument("ddp: worker group: " + what);
  };
  if (o.argv.empty()) bad("no program to run");
  if (o.nproc_per_node < 1) {
    bad("nproc_per_node must be at least 1, got " + std::to_string(o.nproc_per_node));
  }
  if (o.nnodes < 1) bad("nnodes must be at least 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    bad("node_rank must be in [0, nnodes), got " + std::to_string(o.node_rank) + " with nnodes " +
        std::to_string(o.nnodes));
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    bad("master_port is required when nnodes is greater than 1 (every node must use the port of "
        "rank 0's store)");
  }
  if (o.max_restarts < 0) bad("max_restarts must be at least 0");
  if (o.min_nproc < 0 || o.min_nproc > o.nproc_per_node) {
    bad("min_nproc must be in [0, nproc_per_node], got " + std::to_string(o.min_nproc) +
        " with nproc_per_node " + std::to_string(o.nproc_per_node));
  }
  if (o.min_nproc > 0 && o.nnodes > 1) {
    bad("min_nproc works on one node (every node would have to agree on the smaller world), got "
        "nnodes " +
        std::to_string(o.nnodes));
  }
}

}  // namespace

int GroupResult::exit_code() const {
  switch (kind) {
    case Kind::kSucceeded:
      return 0;
    case Kind::kSignalled:
      return 128 + signal;
    case Kind::kTimedOut:
    case Kind::kWorkerFailed:
      break;
  }
  return 1;
}

int received_signal() { return g_signal; }

std::string describe_exit(const WorkerExit& e) {
  std::string out = "rank " + std::to_string(e.rank) +
                    (e.signaled ? " was killed by signal " + describe_signal(e.signal)
                                : " exited with code " + std::to_string(e.exit_code));
  if (e.step >= 0) out += " at step " + std::to_string(e.step);
  return out;
}

GroupResult run_worker_group(const WorkerGroupOptions& options) {
  check_options(options);
  if (options.forward_signals) install_signal_handlers();
  Attempt attempt{options, 0, 0, std::nullopt, {}};
  for (int slot = 0; slot < options.nproc_per_node; ++slot) attempt.slots.push_back(slot);
  if (options.timeout) attempt.deadline = Clock::now() + *options.timeout;
  std::string previous;  // the failure that ended the attempt before, with its step
  for (int k = 0;; ++k) {
    // A fresh port per attempt: the failed attempt's store may still hold (or TIME_WAIT) its own.
    attempt.master_port = options.master_port ? options.master_port : find_free_port();
    attempt.restart_count = options.restart_count + k;
    GroupResult r = GroupRunner(attempt).run();
    r.restarts = k;
    if (r.kind != GroupResult::Kind::kWorkerFailed) return r;
    if (g_signal != 0) {  // signalled while the failed group was stopping: no restart
      r.kind = GroupResult::Kind::kSignalled;
      r.signal = g_signal;
      return r;
    }
    const WorkerExit& failure = *r.first_failure;
    const std::string cause = describe_exit(failure);
    if (k >= options.max_restarts) return r;
    if (failure.step >= 0 && cause == previous) {
      // A resumed run that fails where it failed before will fail there every time.
      r.restart_loop = true;
      say(options, "not restarting: " + cause +
                       " again, as in the attempt before (a restart "
                       "loop: the same failure at the same step)");
      return r;
    }
    previous = cause;
    if (attempt.deadline && Clock::now() >= *attempt.deadline) {
      say(options, "timed out (" + options.timeout_source + "); not restarting");
      return r;
    }
    const int left = static_cast<int>(attempt.slots.size()) - 1;
    if (!failure.ready && options.min_nproc > 0 && left >= options.min_nproc) {
      // Never joined its group: whatever it needs at start-up (its GPU) is gone from its slot.
      attempt.slots.erase(std::find(attempt.slots.begin(), attempt.slots.end(), failure.slot));
      say(options, "rank " + std::to_string(failure.rank) + " (slot " +
                       std::to_string(failure.slot) + ") failed at start-up; going on with " +
                       std::to_string(left) + (left == 1 ? " worker" : " workers") +
                       " (--min-nproc " + std::to_string(options.min_nproc) + ")");
    }
    say(options, "restarting the group (restart " + std::to_string(k + 1) + " of " +
                     std::to_string(options.max_restarts) + ") after " + cause);
  }
}

}  // namespace ddp::launch
