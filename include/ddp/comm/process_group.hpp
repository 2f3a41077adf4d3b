#pragma once
// ddp::comm::ProcessGroup: the collectives libddp needs, over a c10d backend (Gloo or NCCL), with
// one timeout for all of them. Every wait is bounded: a dead or hung rank becomes an error that
// names the collective and the timeout, never a hang.
//
// A group is the world (init_process_group) or a sub-group of it (new_group, DeviceMesh). rank()
// and world_size() are this process's place in the group; global_rank() maps a group rank back
// to the world. Every group owns a store prefix ("ddp/world" for the world, "<parent>/<name>" for
// a sub-group) and store() is scoped to it, so two groups sharing one rendezvous store never read
// each other's keys (progress, replica check, trace merge, the backend's own rendezvous).
//
// [Note: flat collectives] reduce_scatter and all_gather work on flat tensors split by the even
// split rule of flat_shards.hpp (chunk = ceil(N / W); the last shards shorter or empty).
//   Even split (N == W * chunk), backend with flat collectives (NCCL): one c10d call
//   (`_reduce_scatter_base`, `_allgather_base`) straight on the caller's tensors, no copies.
//   Uneven split, same backends: the input is copied into a zero-padded W * chunk buffer
//   (reduce-scatter: N elements copied, W * chunk - N < W zeros; all-gather: the shard padded to
//   chunk and the gathered W * chunk copied back into the N-element output, one extra pass of N).
//   Gloo (1.13 refuses both with "does not support reduce_scatter" / "_allgather_base"):
//   - reduce-scatter is an all-reduce of a full-size temporary copy of the input, of which this
//     rank keeps its slice (a view, no further copy). On the wire that is 2(W-1)/W * N elements
//     per rank instead of (W-1)/W * N: twice a native reduce-scatter; in memory one N-element
//     temporary that lives as long as the result (the result is a view into it), or none with
//     reuse_input (the input itself is reduced; the result is a view into it).
//   - all-gather is an all-reduce (sum) of a zeroed W * chunk buffer holding only this rank's
//     slice: exact, in place, twice a native all-gather's bytes on the wire. Gloo's own list
//     all-gather would gather into a flat tensor that its worker thread frees only some time after
//     the wait (a whole output more alive at moments nobody controls). The even case with a
//     contiguous output gathers straight into it; otherwise one more copy of N into the output.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "ddp/comm/backend.hpp"

namespace ddp::comm {

// Internal (comm/made_backend.hpp, comm/recorder/collective_progress.hpp,
// comm/recorder/collective_watchdog.hpp): declared here so that this public header includes none of
// them.
struct MadeBackend;
struct CollectiveOp;
struct CapturedCollectives;
struct FlightGroup;
class CollectiveCheck;
class CollectiveProgress;
class CollectiveWatchdog;

class ProcessGroup;
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// What a process ends with when a watched collective runs past the timeout or fails unseen
// (Config::watch_collectives): 124, as coreutils' timeout says "timed out".
constexpr int kCollectiveTimeoutExitCode = 124;

// How reduce_scatter combines the ranks' inputs.
enum class ReduceOp { kSum, kAvg };

// An issued reduce_scatter or all_gather: its c10d work and the tensor that holds the result once
// waited for. Wait exactly once, with wait() or wait_on_stream(), before reading result(); the
// group that issued it must outlive it.
class PendingCollective {
 public:
  PendingCollective() = default;
  // The result: this rank's shard (reduce_scatter) or the whole flat tensor (all_gather).
  at::Tensor wait(const std::string& what);
  // As ProcessGroup::wait_on_stream: NCCL orders the caller's current stream after the
  // collective (and after the copy out of a padded buffer), the host goes on at once.
  at::Tensor wait_on_stream(const std::string& what);
  // The tensor the result will be in; valid to read only after a wait.
  const at::Tensor& result() const { return result_; }
  const c10::intrusive_ptr<c10d::Work>& work() const { return work_; }

 private:
  friend class ProcessGroup;
  const ProcessGroup* group_ = nullptr;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor result_;
  // Runs after the wait, on the caller's current stream: the copy out of a padded buffer (uneven
  // all-gather); empty when the result is written in place.
  std::function<void()> finish_;
  at::Tensor finish_after_wait();
};

// Makes the c10d backend of a group over `store` (already under the group's prefix):
// comm/made_backend.hpp.
using BackendFactory =
    std::function<MadeBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)>;

class ProcessGroup {
 public:
  // Who the group is; init_process_group and new_group fill it.
  struct Config {
    Backend backend = Backend::kGloo;
    int rank = 0;  // this process's rank in the group, 0..size-1
    int size = 1;  // ranks in the group
    // The global rank of each member, indexed by group rank; empty: the identity (the world).
    std::vector<int> global_ranks;
    // This group's store prefix; every key it writes lives under "<prefix>/". Default: the world's.
    std::string prefix = "ddp/world";
    // Bound of every collective and store wait. Default 5 minutes, as PyTorch.
    std::chrono::milliseconds timeout = std::chrono::minutes(5);
    // Makes this backend again for sub-groups (new_group, DeviceMesh); empty: none can be made.
    BackendFactory make_backend;
    // Where this rank's collectives run. CPU for Gloo. For NCCL this rank's GPU, which
    // init_process_group pins (cuda:LOCAL_RANK by default); unpinned (a CPU value on a CUDA
    // backend, as a hand-built group has): the caller's current device at construction. One fixed
    // device per group, because NCCL makes a new communicator for every device it is handed: a
    // control scalar on another GPU than the gradients waits for a peer that never joins it.
    // Sub-groups inherit it.
    c10::Device device = c10::kCPU;
    // Watch every collective issued outside a CUDA-graph capture (CollectiveWatchdog) and end the
    // process with kCollectiveTimeoutExitCode, naming the collective and the rank that is behind,
    // once one runs past `timeout`. Unset (default): on where waits are stream dependencies
    // (NCCL: nothing on the host bounds them, and c10d's own watchdog dumps for a minute, then
    // aborts without naming the rank), off where every wait is a bounded host wait that throws
    // (Gloo). Sub-groups inherit it.
    std::optional<bool> watch_collectives;
    // Before each collective, compare what this rank is about to issue with what the first rank
    // to reach the same sequence number issued (comm/recorder/collective_check.hpp): a desync
    // becomes an error naming both collectives before the wrong one is issued. Default off: it
    // costs one store round trip per collective (docs/benchmarks.md). Sub-groups inherit it.
    bool check_collectives = false;
  };

  // Makes the group's backend with config.make_backend over PrefixStore(config.prefix,
  // root_store), then the group. `root_store`: the rendezvous store, unprefixed. `progress_root`:
  // a separate connection to it for the desync heartbeat (see [Note: sequence numbers]); null: no
  // heartbeat, errors still compare what the ranks published.
  static ProcessGroupPtr create(Config config, c10::intrusive_ptr<c10d::Store> root_store,
                                c10::intrusive_ptr<c10d::Store> progress_root = {});

  // A group over an existing backend (tests, callers that made their own c10d group); the store
  // is still scoped to config.prefix.
  ProcessGroup(MadeBackend backend, Config config, c10::intrusive_ptr<c10d::Store> root_store,
               c10::intrusive_ptr<c10d::Store> progress_root = {});
  // Runs the backend's shutdown (NCCL: flushes and destroys the communicators and stops their
  // watchdog, what destroy_process_group does in Python), so a process exits without warnings.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This process's rank in the group and the group's size.
  int rank() const { return config_.rank; }
  int world_size() const { return config_.size; }
  // The global (world) rank of group rank `group_rank`; the world group: the identity.
  int global_rank(int group_rank) const;
  // This process's global rank.
  int global_rank() const { return global_rank(rank()); }
  // The global rank of every member, by group rank.
  std::vector<int> global_ranks() const;

  Backend backend() const { return config_.backend; }
  const char* backend_name() const { return comm::backend_name(config_.backend); }
  const BackendTraits& backend_traits() const { return traits_; }
  // Memory for a collective's buffers: registered with the communicator where the group was made
  // with NcclOptions::register_buffers (comm/nccl_window_pool.hpp; collective: every rank makes
  // the same ones in the same order), else at::empty. During a CUDA-graph capture at::empty (the
  // graph's pool): no segment can be registered then.
  at::Tensor empty_registered(int64_t numel, const at::TensorOptions& options);
  // Whether empty_registered returns registered memory (outside a capture).
  bool registers_buffers() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // This group's store: keys are scoped under prefix().
  c10d::Store& store() { return *store_; }
  const std::string& prefix() const { return config_.prefix; }
  // The device collectives run on: CPU for Gloo, this rank's pinned GPU for NCCL (Config::device).
  // See control_scalars.hpp.
  const c10::Device& device() const { return config_.device; }

  // Whether the backend can sum tensors of `dtype` (Gloo in libtorch 1.13 has no bfloat16 sum).
  bool can_sum(at::ScalarType dtype) const;

  // Asynchronous in-place sum over all ranks. Collectives must be issued in the same order on every
  // rank; the caller keeps that order.
  c10::intrusive_ptr<c10d::Work> allreduce_sum_async(at::Tensor& tensor);
  // Asynchronous in-place average. NCCL divides inside the reduction (ncclAvg: each input is
  // pre-multiplied by 1/world size, so no separate pass over the tensor and no overflow of low
  // precision sums); other backends divide first, then sum.
  c10::intrusive_ptr<c10d::Work> allreduce_avg_async(at::Tensor& tensor);
  // The same for several tensors of one dtype and device, in one grouped collective (c10d's
  // allreduce_coalesced: NCCL issues one all-reduce per tensor inside one group; Gloo flattens
  // them internally). Each tensor is averaged in place; nothing is copied into a flat buffer.
  c10::intrusive_ptr<c10d::Work> allreduce_avg_coalesced_async(std::vector<at::Tensor>& tensors);
  // Whether the average is done inside the collective (NCCL).
  bool reduces_avg() const { return traits_.reduces_avg; }

  // Reduce-scatter of a flat tensor: every rank passes the same numel N; the result is this
  // rank's shard of the sum or average, FlatShards{N, world_size()}.length(rank()) elements
  // (possibly 0). `input` is not modified unless `reuse_input`: then a backend without a native
  // reduce-scatter (Gloo) reduces in it instead of in a full-size copy (the caller's input is a
  // temporary: the sharded units' reduce inputs). Costs per backend: [Note: flat collectives].
  PendingCollective reduce_scatter_async(const at::Tensor& input, ReduceOp op,
                                         bool reuse_input = false);
  // All-gather into a flat tensor: `shard` is this rank's shard of `output` under the even split
  // rule (FlatShards{output.numel(), world_size()}.length(rank()) elements, possibly 0); every
  // rank passes an `output` of the same numel and dtype, written in rank order.
  PendingCollective all_gather_async(const at::Tensor& shard, at::Tensor output);
  // The same into a new flat tensor of `numel` elements.
  PendingCollective all_gather_async(const at::Tensor& shard, int64_t numel);

  // Complete forms: the result is ready for what the caller runs next (wait_on_stream: under NCCL
  // the caller's stream waits and the host goes on, so a collective inside a captured step or
  // between kernels costs no device synchronisation, and a host read of the result waits for it;
  // Gloo waits on the host). Each bounded by timeout() and naming `what` in its error.
  void allreduce_sum(at::Tensor& tensor, const std::string& what);
  void broadcast(at::Tensor& tensor, int root, const std::string& what);
  // Every rank's `tensor` (same shape everywhere), one per rank in rank order; all_gather below
  // is the flat form, one tensor split by the even rule.
  std::vector<at::Tensor> all_gather_each(const at::Tensor& tensor, const std::string& what);
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op, const std::string& what);
  at::Tensor all_gather(const at::Tensor& shard, int64_t numel, const std::string& what);
  void barrier(const std::string& what);

  // Waits for `work` at most timeout(); rethrows its failure with `what` and the timeout named.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;
  // Orders what the caller runs next after `work`, blocking the host as little as the backend
  // allows. NCCL: the caller's current CUDA stream waits on the collective's end event and the host
  // goes on at once (a bounded host wait there would be a device synchronization per bucket); the
  // timeout is enforced by NCCL's watchdog, which ends the process naming the collective. Gloo: the
  // bounded host wait of wait().
  void wait_on_stream(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;

  // The sub-group of this group's ranks `members` (group ranks of this group; their order gives
  // the sub-group's ranks), with store prefix "<prefix()>/<name>". Collective over the members
  // only: each calls it with the same arguments, and `name` must be unique among this group's
  // sub-groups (DeviceMesh uses "mesh<id>/<dim>/<index>"). This rank must be a member. The
  // backend's connection setup is bounded by timeout().
  ProcessGroupPtr new_group(const std::vector<int>& members, const std::string& name);

  // Replaces the backend's shutdown (run once by the destructor).
  void set_shutdown(std::function<void()> shutdown);

  // Desync detection (see [Note: sequence numbers]): who is behind, for an error about the
  // newest collective (a comm hook's future timed out).
  std::string progress_report() const;
  // Collectives this rank has issued on this group so far (each counted once, when issued).
  int64_t collectives_issued() const;
  // Bytes this rank has sent on this group so far, each collective counted as a ring sends it
  // (wire_bytes): what the group costs this rank's links, for the bytes a step sends per group
  // (ddp-bench's JSON; hybrid sharding's cross-node bytes, issue 63).
  int64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  // This group's flight ring as a dump writes it (comm/recorder/flight_ring.hpp): the collectives
  // it issued, newest last (none when the recorder is off).
  FlightGroup flight_snapshot() const;

  // CUDA-graph replays in the flight recorder (graphs/captured_step.hpp). A capture issues its
  // collectives once, into the graph; they run only when it is replayed. captured_since(n), n
  // being collectives_issued() before the capture, marks the collectives issued since as captured
  // and returns them; record_replay numbers and records them again at each replay, as that
  // replay's (`replay`: the captured step), and returns the first number; replay_ended marks
  // them completed, or timed out, once the replay's end is seen (or not).
  std::shared_ptr<const CapturedCollectives> captured_since(int64_t issued_before);
  int64_t record_replay(const CapturedCollectives& captured, int64_t replay);
  void replay_ended(const CapturedCollectives& captured, int64_t first, bool completed);

  // With Config::watch_collectives: bounds `finished` (polled from the watchdog's thread) by the
  // collective timeout like a collective, and returns true; without: false, nothing is watched.
  // For what waits on this group's collectives without a c10d work: a replayed CUDA graph.
  bool watch(std::function<bool()> finished, std::string what);

  // Ends this process after a collective timed out (or failed, `error` its text) where no host
  // wait can throw: writes "ddp: rank R: <what> did not finish within W ms (collective timeout T
  // ms; <which rank is behind>); ending the process with exit code 124" ("failed after W ms
  // (...): <error>; ...") to stderr and exits at once, without destructors (a communicator with a
  // collective that never ends cannot be shut down cleanly). Used by the watchdog and by
  // CapturedStep's replay timeout. `work`: the collective, or null for the newest.
  [[noreturn]] void end_process_after_timeout(const std::string& what, const c10d::Work* work,
                                              std::chrono::milliseconds waited,
                                              const std::string& error = "") const;

  // Unique per-process counter for store keys, so that repeated exchanges do not collide.
  int64_t next_exchange_id() { return exchange_id_++; }

 private:
  std::unique_ptr<MadeBackend> made_;  // never null
  Config config_;
  BackendTraits traits_;
  c10::intrusive_ptr<c10d::Store> root_store_;     // unprefixed: sub-groups prefix it themselves
  c10::intrusive_ptr<c10d::Store> progress_root_;  // unprefixed heartbeat connection; may be null
  c10::intrusive_ptr<c10d::Store> store_;          // PrefixStore(prefix, root_store_)
  std::chrono::milliseconds timeout_;
  int64_t exchange_id_ = 0;  // advances identically on every rank: exchanges are collective
  std::atomic<int64_t> bytes_sent_{0};  // bytes_sent(): issue() adds each collective's
  // Numbers every collective and publishes this rank's count (heartbeat); never null.
  std::unique_ptr<CollectiveProgress> progress_;
  // Config::watch_collectives: bounds the collectives no host wait bounds; null when off. Declared
  // after progress_: its expiry reads the progress report, so it stops first.
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  // Config::check_collectives at world size > 1; null when off.
  std::unique_ptr<CollectiveCheck> check_;
  // Every collective goes through here: checked (check_), launched, numbered and recorded.
  c10::intrusive_ptr<c10d::Work> issue(const CollectiveOp& op,
                                       c10::function_ref<c10::intrusive_ptr<c10d::Work>()> launch);
  // Stream-waited backends: watches an event recorded on the caller's stream after the collective
  // just waited for (without holding its work: see the definition).
  void watch_stream_after() const;
  // After `work`'s wait threw `error`: its flight entry failed or timed out, this rank's flight
  // recorder dumped; returns "; flight recorder dump: <path>" for the error, or "".
  std::string failed(const c10d::Work* work, const std::string& what,
                     const std::string& error) const;
  PendingCollective pending(c10::intrusive_ptr<c10d::Work> work, at::Tensor result,
                            std::function<void()> finish = {}) const;
};

}  // namespace ddp::comm
