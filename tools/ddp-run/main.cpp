// ddp-run: a torchrun-compatible launcher. It starts this node's workers with the torchrun
// environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus
// GROUP_RANK and DDP_RESTART_COUNT), prefixes their output lines with the rank, stops the group
// when one worker fails, restarts it up to --max-restarts times, and forwards SIGINT/SIGTERM.
//
//   ddp-run --nproc-per-node 2 -- ddp-train --steps 100
//
// The rendezvous is the programs' own: rank 0 serves the TCPStore at MASTER_ADDR:MASTER_PORT
// (ddp::comm::init_process_group does this), so ddp-run needs no store of its own.

#include <fcntl.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/flag_parse.hpp"
#include "ddp/files/posix_file.hpp"
#include "ddp/launch/worker_group.hpp"

namespace {

struct Args {
  int nproc_per_node = 1;  // torchrun's default
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free loopback port per attempt (single node only)
  int max_restarts = 0;
  int min_nproc = 0;  // --min-nproc: the fewest workers to go on with; 0: --nproc-per-node
  double grace_s = 10;
  // --timeout-s: every worker's collective timeout (DDP_TIMEOUT_S); 0: the workers' own default.
  double timeout_s = 0;
  double job_timeout_s = 0;  // --job-timeout-s: bound on the whole job; 0: none
  bool no_python = false;
  // --flight-recorder DIR: DDP_FLIGHT_RECORDER_DIR for every worker
  // (comm/recorder/flight_recorder.hpp), and where the dumps are said when the job fails; ""
  // (default): none.
  std::string flight_recorder;
  std::vector<std::string> command;  // after `--`
};

constexpr int kUsageError = 2;  // bad flags, as CLI tools and argparse (torchrun) do

constexpr const char* kNoProgram =
    "no program to run: put it after `--`, as in ddp-run --nproc-per-node 2 -- PROGRAM [ARGS...]";

// Our own lines go out whole, in one write, like the workers' (see ddp/launch/line_relay.hpp).
void say(const std::string& message) {
  const std::string line = "ddp-run: " + message + "\n";
  (void)ddp::files::write_all(STDERR_FILENO, line.data(), line.size());
}

int usage_error(const std::string& message) {
  say(message);
  return kUsageError;
}

std::string format(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Checks what CLI11 cannot express alone; returns the message, or "" when the flags are usable.
std::string check_args(const Args& a, bool port_given) {
  if (a.nproc_per_node < 1) {
    return "--nproc-per-node must be at least 1, got " + std::to_string(a.nproc_per_node);
  }
  if (a.nnodes < 1) return "--nnodes must be at least 1, got " + std::to_string(a.nnodes);
  if (a.node_rank < 0 || a.node_rank >= a.nnodes) {
    return "--node-rank must be in [0, --nnodes), got --node-rank " + std::to_string(a.node_rank) +
           " with --nnodes " + std::to_string(a.nnodes);
  }
  if (port_given && (a.master_port < 1 || a.master_port > 65535)) {
    return "--master-port must be in 1..65535, got " + std::to_string(a.master_port);
  }
  if (!port_given && a.nnodes > 1) {
    // Each node would pick a different free port: the nodes must agree on rank 0's.
    return "--master-port is required when --nnodes is greater than 1 (every node must use the "
           "port of rank 0's store)";
  }
  if (a.max_restarts < 0) {
    return "--max-restarts must be at least 0, got " + std::to_string(a.max_restarts);
  }
  if (a.min_nproc < 0 || a.min_nproc > a.nproc_per_node) {
    return "--min-nproc must be in [0, --nproc-per-node " + std::to_string(a.nproc_per_node) +
           "], got " + std::to_string(a.min_nproc);
  }
  if (a.min_nproc > 0 && a.nnodes > 1) {
    return "--min-nproc works on one node only (every node would have to agree on the smaller "
           "world)";
  }
  if (!(a.grace_s >= 0)) return "--grace-s must be at least 0, got " + format(a.grace_s);
  if (a.command.empty()) {
    return kNoProgram;
  }
  return "";
}

// Our output is the workers' only way out, and a pipe must not land on fd 0-2: a launcher started
// with a closed stdout would otherwise hand a worker's pipe its stdout number.
void open_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
  }
}

template <typename T>
std::chrono::milliseconds to_ms(T seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Everything else is the library's WorkerGroup: environment, prefixes, signals, restarts.
int run(const Args& a, bool port_given) {
  ddp::launch::WorkerGroupOptions g;
  g.argv = a.command;
  g.nproc_per_node = a.nproc_per_node;
  g.nnodes = a.nnodes;
  g.node_rank = a.node_rank;
  g.master_addr = a.master_addr;
  g.master_port = port_given ? static_cast<uint16_t>(a.master_port) : 0;  // 0: fresh per attempt
  g.max_restarts = a.max_restarts;
  g.min_nproc = a.min_nproc;
  g.grace = to_ms(a.grace_s);
  if (a.job_timeout_s > 0) g.timeout = to_ms(a.job_timeout_s);
  g.timeout_source = "--job-timeout-s";
  if (a.timeout_s > 0) g.env["DDP_TIMEOUT_S"] = format(a.timeout_s);
  if (!a.flight_recorder.empty()) g.env["DDP_FLIGHT_RECORDER_DIR"] = a.flight_recorder;
  const int code = ddp::launch::run_worker_group(g).exit_code();
  if (code != 0 && !a.flight_recorder.empty()) {
    say("flight recorder dumps in " + a.flight_recorder + " (ddp-forensics " + a.flight_recorder +
        " names the first divergence)");
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  open_standard_fds();
  // Everything after the first `--` is the worker command, never our flags: a program's own
  // --timeout-s must not be taken for ddp-run's.
  int flags_end = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      flags_end = i;
      break;
    }
  }
  Args a;
  for (int i = flags_end + 1; i < argc; ++i) a.command.push_back(argv[i]);

  CLI::App app{
      "ddp-run: start N workers per node with the torchrun environment (RANK, LOCAL_RANK, "
      "WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, DDP_RESTART_COUNT)"};
  app.footer("Everything after `--` is the worker command: ddp-run [FLAGS] -- PROGRAM [ARGS...]");
  // torchrun spells its flags both ways; so do we, so that its command lines work unchanged.
  app.add_option("--nproc-per-node,--nproc_per_node", a.nproc_per_node, "workers on this node")
      ->capture_default_str();
  app.add_option("--nnodes", a.nnodes, "nodes in the job")->capture_default_str();
  app.add_option("--node-rank,--node_rank", a.node_rank, "this node's index, 0..nnodes-1")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", a.master_addr, "address of rank 0's node")
      ->capture_default_str();
  auto* port = app.add_option("--master-port,--master_port", a.master_port,
                              "rank 0's store port (default: a free port; required with "
                              "--nnodes > 1)");
  app.add_option("--max-restarts,--max_restarts", a.max_restarts,
                 "restart the local group this many times after a failure (not after the same "
                 "failure at the same step twice: a restart loop)")
      ->capture_default_str();
  app.add_option("--min-nproc", a.min_nproc,
                 "when a worker fails at start-up (its device gone), restart with the others, as "
                 "long as at least this many remain (0: never fewer than --nproc-per-node)")
      ->capture_default_str();
  app.add_option("--grace-s", a.grace_s, "seconds between SIGTERM and SIGKILL when stopping")
      ->capture_default_str();
  app.add_flag("--no-python,--no_python", a.no_python,
               "accepted for torchrun compatibility: PROGRAM is always run directly");
  app.add_option("--flight-recorder", a.flight_recorder,
                 "directory for every worker's flight recorder dump (libddp programs; read them "
                 "with ddp-forensics)");
  auto* timeout = app.add_option("--timeout-s", a.timeout_s,
                                 "every worker's collective timeout in seconds, as DDP_TIMEOUT_S "
                                 "(default: the workers' own, 300 for libddp's)");
  auto* job_timeout = app.add_option("--job-timeout-s", a.job_timeout_s,
                                     "bound on the whole job in seconds (default: none)");
  // `ddp-run --nproc-per-node 2 prog`: a word CLI11 cannot place, and no `--` before it.
  if (const int code = ddp::tools::parse_flags(app, flags_end, argv, "ddp-run",
                                               flags_end == argc ? kNoProgram : "");
      code >= 0) {
    return code;
  }
  if (timeout->count() > 0 && !(a.timeout_s > 0)) {
    return usage_error("--timeout-s must be greater than 0, got " + format(a.timeout_s));
  }
  if (job_timeout->count() > 0 && !(a.job_timeout_s > 0)) {
    return usage_error("--job-timeout-s must be greater than 0, got " + format(a.job_timeout_s));
  }
  const std::string bad = check_args(a, port->count() > 0);
  if (!bad.empty()) return usage_error(bad);

  try {
    return run(a, port->count() > 0);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
