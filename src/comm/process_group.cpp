#include "ddp/comm/process_group.hpp"

#include "ddp/comm/done_work.hpp"
#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/made_backend.hpp"
#include "ddp/comm/recorder/collective_check.hpp"
#include "ddp/comm/recorder/collective_progress.hpp"
#include "ddp/comm/recorder/collective_watchdog.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "ddp/detail/capture_status.hpp"
#include "ddp/obs/log.hpp"

namespace ddp::comm {

namespace {

// "; flight recorder dump: <path>" for an error, or "" when none was written.
std::string dump_note(const std::string& path) {
  return path.empty() ? "" : "; flight recorder dump: " + path;
}

std::chrono::milliseconds heartbeat_interval() {
  long interval_ms = 1000;
  if (const char* text = std::getenv("DDP_HEARTBEAT_MS")) interval_ms = std::atol(text);
  TORCH_CHECK(interval_ms > 0, "ddp: DDP_HEARTBEAT_MS must be a positive number of ms, got '",
              std::getenv("DDP_HEARTBEAT_MS"), "'");
  return std::chrono::milliseconds(interval_ms);
}

}  // namespace

ProcessGroupPtr ProcessGroup::create(Config config, c10::intrusive_ptr<c10d::Store> root_store,
                                     c10::intrusive_ptr<c10d::Store> progress_root) {
  TORCH_CHECK(config.make_backend, "ddp: ProcessGroup::create needs Config::make_backend");
  TORCH_CHECK(root_store, "ddp: ProcessGroup::create needs a store");
  auto store = c10::make_intrusive<c10d::PrefixStore>(config.prefix, root_store);
  MadeBackend made = config.make_backend(store, config.rank, config.size);
  return std::make_shared<ProcessGroup>(std::move(made), std::move(config), std::move(root_store),
                                        std::move(progress_root));
}

ProcessGroup::ProcessGroup(MadeBackend backend, Config config,
                           c10::intrusive_ptr<c10d::Store> root_store,
                           c10::intrusive_ptr<c10d::Store> progress_root)
    : made_(std::make_unique<MadeBackend>(std::move(backend))),
      config_(std::move(config)),
      traits_(traits(config_.backend)),
      root_store_(std::move(root_store)),
      progress_root_(std::move(progress_root)),
      timeout_(config_.timeout) {
  TORCH_CHECK(made_->backend, "ddp: ProcessGroup needs a c10d backend");
  if (traits_.device_type == c10::DeviceType::CPU) {
    config_.device = c10::Device(c10::kCPU);
  } else if (config_.device.type() != traits_.device_type) {
    // Unpinned: the device guard registry answers without CUDA headers.
    config_.device = c10::impl::getDeviceGuardImpl(traits_.device_type)->getDevice();
  }
  TORCH_CHECK(root_store_, "ddp: ProcessGroup needs a store");
  TORCH_CHECK(config_.size >= 1 && config_.rank >= 0 && config_.rank < config_.size, "ddp: rank ",
              config_.rank, " is outside world size ", config_.size);
  TORCH_CHECK(
      config_.global_ranks.empty() || static_cast<int>(config_.global_ranks.size()) == config_.size,
      "ddp: ProcessGroup '", config_.prefix, "' has ", config_.size, " ranks but ",
      config_.global_ranks.size(), " global ranks");
  TORCH_CHECK(!config_.prefix.empty(), "ddp: ProcessGroup needs a store prefix");
  store_ = c10::make_intrusive<c10d::PrefixStore>(config_.prefix, root_store_);
  c10::intrusive_ptr<c10d::Store> progress_store;
  if (progress_root_) {
    progress_store = c10::make_intrusive<c10d::PrefixStore>(config_.prefix, progress_root_);
  }
  progress_ = std::make_unique<CollectiveProgress>(
      progress_store, config_.rank, config_.size, heartbeat_interval(), config_.prefix,
      global_ranks(), flight_recorder_options().capacity);
  if (config_.check_collectives && config_.size > 1) {
    // The heartbeat's connection when there is one: the check's compare-and-set never waits, so
    // it cannot stall behind a long store wait of another thread on the main connection.
    check_ = std::make_unique<CollectiveCheck>(progress_store ? progress_store : store_,
                                               config_.rank, config_.prefix);
  }
  if (config_.watch_collectives.value_or(traits_.waits_on_stream)) {
    // Polled 10 times per timeout, at most every 100 ms: the error comes within a tenth of the
    // timeout after it, and a poll (one event query) costs nothing next to a collective.
    const auto poll = std::clamp<std::chrono::milliseconds>(
        timeout_ / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        timeout_, poll,
        [this](const CollectiveWatchdog::Watched& expired, std::chrono::milliseconds waited,
               const std::string& error) {
          end_process_after_timeout(expired.what, expired.work.get(), waited, error);
        });
  }
}

bool ProcessGroup::watch(std::function<bool()> finished, std::string what) {
  if (!watchdog_) return false;
  watchdog_->watch(
      {[finished = std::move(finished)](std::string*) { return finished(); }, {}, std::move(what)});
  return true;
}

void ProcessGroup::end_process_after_timeout(const std::string& what, const c10d::Work* work,
                                             std::chrono::milliseconds waited,
                                             const std::string& error) const {
  // Who is behind, from the store (bounded: CollectiveProgress::report).
  const std::string who = progress_->report(work);
  if (work != nullptr) {
    progress_->done(work, error.empty() ? FlightState::kTimedOut : FlightState::kFailed);
  }
  const std::string dumped = dump_note(dump_flight_recorder(what + " timed out"));
  const std::string verdict = error.empty() ? " did not finish within " : " failed after ";
  const std::string text = "ddp: rank " + std::to_string(global_rank()) + ": " + what + verdict +
                           std::to_string(waited.count()) + " ms (collective timeout " +
                           std::to_string(timeout_.count()) + " ms" + who + ")" +
                           (error.empty() ? "" : ": " + error) + dumped +
                           "; ending the process with exit code " +
                           std::to_string(kCollectiveTimeoutExitCode) + "\n";
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kCollectiveTimeoutExitCode);
}

namespace {

// The failure of a collective as one line of text: torch's errors carry a backtrace in what()
// (13 lines of frames), which belongs in the flight dump, not in the error a user reads.
std::string without_backtrace(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    std::string text = error->what_without_backtrace();
    const size_t raised = text.find("\nException raised from");
    return raised == std::string::npos ? text : text.substr(0, raised);
  }
  return e.what();
}

}  // namespace

std::string ProcessGroup::failed(const c10d::Work* work, const std::string& what,
                                 const std::string& error) const {
  // c10d says "Timed out" (Gloo) or "timed out" / "Watchdog caught collective operation timeout"
  // (NCCL) for a wait that ran out; anything else is the collective's own failure.
  const bool timed_out =
      error.find("imed out") != std::string::npos || error.find("timeout") != std::string::npos;
  progress_->done(work, timed_out ? FlightState::kTimedOut : FlightState::kFailed);
  return dump_note(dump_flight_recorder(what + " failed: " + error));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::issue(
    const CollectiveOp& op, c10::function_ref<c10::intrusive_ptr<c10d::Work>()> launch) {
  if (check_) {
    const std::string differs =
        check_->before(progress_->count() + 1, CollectiveCheck::fingerprint(op, current_purpose()));
    if (!differs.empty()) {
      progress_->refused(op);
      const std::string dumped =
          dump_note(dump_flight_recorder("the collective check: " + differs));
      TORCH_CHECK(false, "ddp: ", differs,
                  " (found by the collective check before this rank issued it; every rank must "
                  "issue the same collectives in the same order",
                  dumped, ")");
    }
  }
  c10::intrusive_ptr<c10d::Work> work = launch();
  progress_->issued(work.get(), op);
  bytes_sent_.fetch_add(op.wire_bytes(world_size(), !traits_.flat_collectives),
                        std::memory_order_relaxed);
  // Host-waited backends are watched from the issue, through the work itself. Stream-waited ones
  // (NCCL) from wait_on_stream, through an event of ours, a plain device query: WorkNCCL's
  // isCompleted also reads the communicator's error state under its lock (on 2x H200 a watchdog
  // that polled it, in one thread with its clock, never fired with a SIGSTOPped peer; see the
  // watchdog's note on blocking queries). Work made under a capture has no event to poll until a
  // replay: CapturedStep bounds replays.
  if (watchdog_ && !traits_.waits_on_stream && !detail::is_capturing(config_.device)) {
    watchdog_->watch(work);
  }
  return work;
}

at::Tensor ProcessGroup::empty_registered(int64_t numel, const at::TensorOptions& options) {
  if (!made_->empty_registered || detail::is_capturing(config_.device)) {
    return at::empty({numel}, options);
  }
  return made_->empty_registered(numel, options);
}

bool ProcessGroup::registers_buffers() const { return static_cast<bool>(made_->empty_registered); }

void ProcessGroup::set_shutdown(std::function<void()> shutdown) {
  made_->shutdown = std::move(shutdown);
}

std::string ProcessGroup::progress_report() const { return progress_->report(nullptr); }

int64_t ProcessGroup::collectives_issued() const { return progress_->count(); }

FlightGroup ProcessGroup::flight_snapshot() const { return progress_->ring().snapshot(); }

std::shared_ptr<const CapturedCollectives> ProcessGroup::captured_since(int64_t issued_before) {
  return std::make_shared<const CapturedCollectives>(
      progress_->ring().capture_since(issued_before));
}

int64_t ProcessGroup::record_replay(const CapturedCollectives& captured, int64_t replay) {
  return progress_->ring().record_replay(captured, replay);
}

void ProcessGroup::replay_ended(const CapturedCollectives& captured, int64_t first,
                                bool completed) {
  const auto count = static_cast<int64_t>(captured.entries.size());
  progress_->ring().end_range(first, first + count - 1,
                              completed ? FlightState::kCompleted : FlightState::kTimedOut);
}

ProcessGroup::~ProcessGroup() {
  if (watchdog_) {
    // A communicator shut down under a running collective hangs: let the watched ones finish
    // first (a collective that never does ends the process, named, at its timeout).
    watchdog_->wait_idle();
    watchdog_.reset();  // before the heartbeat: its expiry reads the progress report
  }
  progress_.reset();  // stop the heartbeat before the backend goes
  if (!made_->shutdown) return;
  try {
    made_->shutdown();
  } catch (const std::exception& e) {
    // A destructor must not throw; the process is ending its use of the group anyway.
    obs::log(obs::LogLevel::kWarn, global_rank(),
             std::string("ddp: shutting down the ") + backend_name() + " process group '" +
                 config_.prefix + "' failed: " + e.what());
  }
}

int ProcessGroup::global_rank(int group_rank) const {
  TORCH_CHECK(group_rank >= 0 && group_rank < config_.size, "ddp: group rank ", group_rank,
              " is outside group '", config_.prefix, "' of ", config_.size, " ranks");
  if (config_.global_ranks.empty()) return group_rank;
  return config_.global_ranks[static_cast<size_t>(group_rank)];
}

std::vector<int> ProcessGroup::global_ranks() const {
  std::vector<int> ranks;
  for (int r = 0; r < config_.size; ++r) ranks.push_back(global_rank(r));
  return ranks;
}

bool ProcessGroup::can_sum(at::ScalarType dtype) const {
  return traits_.sums_bf16 || dtype != at::kBFloat16;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_sum_async(at::Tensor& tensor) {
  // Nothing to send (every rank passes the same numel, so every rank skips it, as the flat
  // collectives do): Gloo's ring algorithms divide by the element count.
  if (tensor.numel() == 0) return done_work({tensor});
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  return issue({"all-reduce (sum)", tensor.numel(), tensor.scalar_type()},
               [&] { return made_->backend->allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_avg_async(at::Tensor& tensor) {
  // The average over one rank is the tensor itself. NCCL's AVG is a pre-multiplied sum, which at
  // one rank still launches a scaling kernel over the whole buffer (a read and a write of every
  // bucket: the toy's captured DDP step on an H100 took 80 us more with AVG than with no
  // collective at all); its in-place SUM at one rank launches nothing.
  if (world_size() == 1 || tensor.numel() == 0) return allreduce_sum_async(tensor);
  if (!reduces_avg()) {
    tensor.div_(world_size());
    return allreduce_sum_async(tensor);
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::AVG;
  opts.timeout = timeout_;
  return issue({"all-reduce (average)", tensor.numel(), tensor.scalar_type()},
               [&] { return made_->backend->allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_avg_coalesced_async(
    std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(!tensors.empty(), "ddp: allreduce_avg_coalesced_async needs at least one tensor");
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.numel();
  if (numel == 0) return done_work(tensors);  // as allreduce_sum_async
  c10d::AllreduceCoalescedOptions opts;
  opts.timeout = timeout_;
  // One rank: an in-place sum launches nothing (see allreduce_avg_async); a backend that cannot
  // average divides first.
  opts.reduceOp = world_size() > 1 && reduces_avg() ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  if (world_size() > 1 && !reduces_avg()) {
    for (auto& t : tensors) t.div_(world_size());
  }
  const char* what = opts.reduceOp == c10d::ReduceOp::AVG ? "all-reduce coalesced (average)"
                                                          : "all-reduce coalesced (sum)";
  return issue({what, numel, tensors[0].scalar_type()},
               [&] { return made_->backend->allreduce_coalesced(tensors, opts); });
}

void ProcessGroup::wait_on_stream(const c10::intrusive_ptr<c10d::Work>& work,
                                  const std::string& what) const {
  if (!traits_.waits_on_stream) {
    wait(work, what);
    return;
  }
  try {
    work->wait();  // no timeout argument: a stream dependency, not a host wait
  } catch (const std::exception& e) {
    const std::string report = progress_->report(work.get());
    TORCH_CHECK(false, "ddp: ", what, " failed on rank ", rank(), " of ", world_size(),
                " (collective timeout ", timeout_.count(), " ms", report,
                "): ", without_backtrace(e), failed(work.get(), what, e.what()));
  }
  if (watchdog_ && !detail::is_capturing(config_.device)) watch_stream_after();
  progress_->done(work.get());
}

void ProcessGroup::watch_stream_after() const {
  // An event on the caller's stream, now after the collective: it fires once the collective (and
  // the work queued before it) ran. Queried without any lock of the communicator's.
  const c10::DeviceType type = config_.device.type();
  const auto* guard = c10::impl::getDeviceGuardImpl(type);
  auto done = std::make_shared<c10::Event>(type);
  done->record(guard->getStream(config_.device));
  const c10::Device device = config_.device;
  // The entry holds no reference to the work: a work holds its tensors, and the poller drops an
  // entry only at its next tick (up to 100 ms later), so an in-place reduction's gradients (1.6 GB
  // on gpt2-medium) would outlive the step into the next backward's peak. The work was waited for
  // (done() ran), so a report names the newest collective, as it would from the work.
  watchdog_->watch({[done, guard, device](std::string*) {
                      guard->setDevice(device);  // the watchdog's thread has no current device
                      return done->query();
                    },
                    {},
                    "a collective"});
}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
  // Work::wait rethrows the collective's own failure (e.g. a peer closed its connection) and
  // throws once the timeout passes.
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    const std::string report = progress_->report(work.get());
    TORCH_CHECK(false, "ddp: ", what, " failed on rank ", rank(), " of ", world_size(),
                " (collective timeout ", timeout_.count(),
                " ms; another rank may have died, hung, or issued different collectives", report,
                "): ", without_backtrace(e), failed(work.get(), what, e.what()));
  }
  progress_->done(work.get());
}

void ProcessGroup::allreduce_sum(at::Tensor& tensor, const std::string& what) {
  wait_on_stream(allreduce_sum_async(tensor), what);
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root, const std::string& what) {
  if (tensor.numel() == 0) return;  // as allreduce_sum_async
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  wait_on_stream(issue({"broadcast", tensor.numel(), tensor.scalar_type(), root},
                       [&] { return made_->backend->broadcast(tensors, opts); }),
                 what);
}

std::vector<at::Tensor> ProcessGroup::all_gather_each(const at::Tensor& tensor,
                                                      const std::string& what) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  // Gloo's all-gather of zero elements divides by zero (SIGFPE); every rank's is empty anyway.
  if (tensor.numel() == 0) return outputs[0];
  std::vector<at::Tensor> inputs{tensor};
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  wait_on_stream(issue({"all-gather", tensor.numel(), tensor.scalar_type()},
                       [&] { return made_->backend->allgather(outputs, inputs, opts); }),
                 what);
  return outputs[0];
}

void ProcessGroup::barrier(const std::string& what) {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  wait(issue({"barrier"}, [&] { return made_->backend->barrier(opts); }), what);
}

ProcessGroupPtr ProcessGroup::new_group(const std::vector<int>& members, const std::string& name) {
  TORCH_CHECK(config_.make_backend, "ddp: process group '", config_.prefix,
              "' cannot make sub-groups (it was built without a backend factory)");
  TORCH_CHECK(!name.empty(), "ddp: new_group needs a name (its store prefix under '",
              config_.prefix, "')");
  Config sub = config_;
  sub.prefix = config_.prefix + "/" + name;
  sub.size = static_cast<int>(members.size());
  sub.rank = -1;
  sub.global_ranks.clear();
  std::vector<bool> seen(static_cast<size_t>(world_size()), false);
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    TORCH_CHECK(m >= 0 && m < world_size() && !seen[static_cast<size_t>(m)], "ddp: new_group '",
                name, "': member ", m, " is ",
                (m >= 0 && m < world_size() ? "listed twice" : "outside the group"), " (group '",
                config_.prefix, "' has ", world_size(), " ranks)");
    seen[static_cast<size_t>(m)] = true;
    if (m == rank()) sub.rank = static_cast<int>(i);
    sub.global_ranks.push_back(global_rank(m));
  }
  TORCH_CHECK(sub.rank >= 0, "ddp: new_group '", name, "': rank ", rank(),
              " is not a member; only members create a sub-group");
  return create(std::move(sub), root_store_, progress_root_);
}

}  // namespace ddp::comm
