#include "ddp/comm/recorder/flight_recorder.hpp"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddp/comm/launcher_channel.hpp"
#include "ddp/comm/recorder/flight_ring.hpp"
#include "ddp/files/posix_file.hpp"

namespace ddp::comm {

namespace {

using json = nlohmann::json;

thread_local CollectivePurpose t_purpose;
std::atomic<int64_t> g_step{-1};
// When SIGCONT last continued this process (unix us; 0: never). The launcher continues only a
// stopped worker, so a dump that carries it says the rank was stopped (SIGSTOP, a debugger) until
// then: ddp-forensics names it even when it ran on after being continued.
std::atomic<int64_t> g_continued_us{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "written from a signal handler");

// One dump at a time: the signal thread's (SIGTERM) and a failed wait's on another thread would
// otherwise write the same temporary file, and SIGTERM's ending of the process could cut the other
// one short and leave it behind. The process's exit takes it too (and keeps it): a SIGTERM that
// arrives while a failed rank returns from main would otherwise start a dump the exit cuts short.
// Timed, so that exit waits for a stuck dump only so long. Leaked, as settings().
std::timed_mutex& dump_mutex() {
  static auto* m = new std::timed_mutex();
  return *m;
}

// At exit: wait for a dump in progress (bounded) and let none start after it.
void hold_dumps_at_exit() { (void)dump_mutex().try_lock_for(std::chrono::seconds(10)); }

FlightRecorderOptions options_from_env() {
  FlightRecorderOptions o;
  if (const char* size = std::getenv("DDP_FLIGHT_RECORDER_SIZE")) {
    char* end = nullptr;
    const long long n = std::strtoll(size, &end, 10);
    TORCH_CHECK(*size != '\0' && *end == '\0' && n >= 0,
                "ddp: DDP_FLIGHT_RECORDER_SIZE must be a whole number of entries (0: off), got '",
                size, "'");
    o.capacity = n;
  }
  if (const char* dir = std::getenv("DDP_FLIGHT_RECORDER_DIR")) o.dir = dir;
  return o;
}

struct Settings {
  std::mutex mutex;
  FlightRecorderOptions options;
  bool signals_installed = false;
  Settings() : options(options_from_env()) {}
};

Settings& settings() {
  static auto* s = new Settings();  // leaked: dumps run from signal-driven and exiting threads
  return *s;
}

int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The mesh dimension of a DeviceMesh group ("<parent>/mesh<id>/<dim>/<index>"); -1 otherwise.
int mesh_dim_of(const std::string& name) {
  const size_t at = name.rfind("/mesh");
  if (at == std::string::npos) return -1;
  const size_t slash = name.find('/', at + 5);
  if (slash == std::string::npos) return -1;
  return std::atoi(name.c_str() + slash + 1);
}

json entry_json(const FlightEntry& e) {
  return {{"seq", e.seq},
          {"kind", e.op.kind},
          {"dtype", c10::toString(e.op.dtype)},
          {"numel", e.op.numel},
          {"root", e.op.root},
          {"purpose", purpose_name(e.purpose.what)},
          {"index", e.purpose.index},
          {"epoch", e.purpose.epoch},
          {"step", e.step},
          {"issued_us", e.issued_us},
          {"ended_us", e.ended_us},
          {"state", flight_state_name(e.state)},
          {"replay", e.replay}};
}

struct Dump {
  int rank = -1;       // global; -1: no group made yet (then RANK's, or 0)
  int world_size = 0;  // 0: no group alive
  std::string text;
};

// This rank's dump: every ring of the process.
Dump make_dump(const std::string& reason) {
  json groups = json::array();
  int global_rank = -1;
  int world_size = 0;
  for_each_flight_ring([&](const FlightRing& ring) {
    const FlightGroup g = ring.snapshot();
    json entries = json::array();
    for (const FlightEntry& e : g.entries) entries.push_back(entry_json(e));
    groups.push_back({{"name", g.name},
                      {"mesh_dim", mesh_dim_of(g.name)},
                      {"rank", g.rank},
                      {"global_ranks", g.global_ranks},
                      {"issued", g.issued},
                      {"capacity", g.capacity},
                      {"entries", std::move(entries)}});
    const int mine = g.global_ranks.at(static_cast<size_t>(g.rank));
    const int size = static_cast<int>(g.global_ranks.size());
    // The widest group is the world (its global ranks are every rank).
    if (size > world_size || global_rank < 0) {
      world_size = std::max(world_size, size);
      global_rank = mine;
    }
  });
  if (global_rank < 0) {
    const char* env_rank = std::getenv("RANK");
    global_rank = env_rank != nullptr ? std::atoi(env_rank) : 0;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const json dump = {{"format", "ddp-flight-recorder"},
                     {"version", kFlightDumpVersion},
                     {"rank", global_rank},
                     {"world_size", world_size},
                     {"pid", static_cast<int64_t>(::getpid())},
                     {"host", host},
                     {"reason", reason},
                     {"dumped_us", unix_us()},
                     {"continued_us", g_continued_us.load()},
                     {"groups", std::move(groups)}};
  return {global_rank, world_size, dump.dump(1) + "\n"};
}

// The dump itself; the caller holds dump_mutex().
std::string write_dump(const std::string& reason) {
  const std::string dir = flight_recorder_options().dir;
  if (dir.empty()) return "";
  try {
    const Dump dump = make_dump(reason);
    // No group alive (none made yet, or all destroyed while the process ends): nothing to say, and
    // an earlier dump of this rank (a failed wait's) must not be overwritten by an empty one.
    if (dump.world_size == 0) return "";
    const std::string path = dir + "/flight-rank" + std::to_string(dump.rank) + ".json";
    files::write_file_atomic(path, dump.text);
    return path;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: the flight recorder could not write its dump to '%s': %s\n",
                 dir.c_str(), e.what());
    return "";
  }
}

int g_signal_pipe[2] = {-1, -1};
// The signal thread writes a byte here once an abort's dump is written.
int g_dumped_pipe[2] = {-1, -1};
std::atomic<bool> g_aborting{false};
pthread_t g_signal_thread{};

void on_signal(int signo) {
  if (signo == SIGCONT) {
    // clock_gettime is async-signal-safe; the store is a lock-free atomic.
    struct timespec now {};
    ::clock_gettime(CLOCK_REALTIME, &now);
    g_continued_us.store(int64_t(now.tv_sec) * 1000000 + now.tv_nsec / 1000);
    return;
  }
  const auto byte = static_cast<unsigned char>(signo);
  const int saved = errno;  // a handler must leave errno as it found it
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// SIGABRT: the process is ending now (c10d's NCCL watchdog aborting after its own timeout, an
// uncaught exception, a failed assertion). The handler asks the signal thread for the dump and
// waits for it, bounded (the aborting thread may hold a lock the dump needs), then ends the
// process by SIGABRT as it would have. Only async-signal-safe calls here.
void on_abort(int) {
  if (!g_aborting.exchange(true) && !::pthread_equal(::pthread_self(), g_signal_thread)) {
    const auto byte = static_cast<unsigned char>(SIGABRT);
    (void)!::write(g_signal_pipe[1], &byte, 1);
    struct pollfd done {};
    done.fd = g_dumped_pipe[0];
    done.events = POLLIN;
    (void)::poll(&done, 1, /*timeout ms=*/10000);
  }
  ::signal(SIGABRT, SIG_DFL);
  ::raise(SIGABRT);
}

// Dumps outside the handler (nothing a dump does is async-signal-safe), on its own thread.
void signal_loop() {
  for (;;) {
    unsigned char byte = 0;
    const ssize_t n = ::read(g_signal_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    if (byte == SIGUSR1) {
      dump_flight_recorder("SIGUSR1");
      continue;
    }
    if (byte == SIGABRT) {
      dump_flight_recorder("SIGABRT (the process is aborting)");
      const unsigned char done = 1;
      (void)!::write(g_dumped_pipe[1], &done, 1);
      continue;  // the aborting thread ends the process
    }
    // SIGTERM, or SIGPIPE: a rank continued after its peers left writes into their closed
    // sockets, and SIGPIPE's default would end it before any dump. Holding the dump lock to the
    // end: no other thread's dump is cut short by the ending.
    const int signo = byte;
    std::lock_guard<std::timed_mutex> lock(dump_mutex());
    write_dump(signo == SIGPIPE ? "SIGPIPE (a peer closed its connection)" : "SIGTERM");
    ::signal(signo, SIG_DFL);  // then end as the signal would have: the launcher reads it
    ::raise(signo);
  }
}

void install_signals() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0 || ::pipe2(g_dumped_pipe, O_CLOEXEC) != 0) {
    TORCH_CHECK(false, "ddp: the flight recorder's signal pipe: ", std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGCONT, &action, nullptr);
  // SIGPIPE only where it would end the process (a program that ignores it keeps ignoring it).
  struct sigaction pipe_before {};
  if (::sigaction(SIGPIPE, nullptr, &pipe_before) == 0 && pipe_before.sa_handler == SIG_DFL) {
    ::sigaction(SIGPIPE, &action, nullptr);
  }
  std::atexit(hold_dumps_at_exit);
  std::thread loop(signal_loop);
  g_signal_thread = loop.native_handle();
  loop.detach();
  struct sigaction abort_action {};
  abort_action.sa_handler = on_abort;
  sigemptyset(&abort_action.sa_mask);
  ::sigaction(SIGABRT, &abort_action, nullptr);
}

}  // namespace

void set_flight_recorder(const FlightRecorderOptions& options) {
  TORCH_CHECK(options.capacity >= 0,
              "ddp: the flight recorder's capacity is a number of entries per group (0: off), got ",
              options.capacity);
  if (!options.dir.empty() && ::mkdir(options.dir.c_str(), 0777) != 0 && errno != EEXIST) {
    TORCH_CHECK(false, "ddp: the flight recorder's directory '", options.dir,
                "' cannot be made: ", std::strerror(errno));
  }
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.options = options;
  if (!options.dir.empty() && !s.signals_installed) {
    install_signals();
    s.signals_installed = true;
  }
}

FlightRecorderOptions flight_recorder_options() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.options;
}

ForPurpose::ForPurpose(CollectivePurpose purpose) : saved_(t_purpose) { t_purpose = purpose; }

ForPurpose::~ForPurpose() { t_purpose = saved_; }

void note_step(int64_t step) {
  if (g_step.exchange(step, std::memory_order_relaxed) != step) tell_launcher_step(step);
}

CollectivePurpose current_purpose() { return t_purpose; }

int64_t current_step() { return g_step.load(std::memory_order_relaxed); }

std::string dump_flight_recorder(const std::string& reason) {
  std::lock_guard<std::timed_mutex> lock(dump_mutex());
  return write_dump(reason);
}

}  // namespace ddp::comm
