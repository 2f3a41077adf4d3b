#pragma once
// CapturedStep: a whole training step (forward, loss, backward with its bucket collectives,
// optimizer step) recorded once into a CUDA graph and replayed, so that the host launches one
// graph instead of hundreds of kernels and the reducer's bookkeeping runs once, at capture.
//
//   warm-up   run() executes the step eagerly on the capture stream, `warmup_steps` times: the
//             bucket plan becomes final (rebuilt after the first step), every collective and
//             bucket size runs once (NCCL connects lazily), the optimizer makes its state, and
//             every AccumulateGrad node remembers the capture stream (it keeps the stream of its
//             first use; a graph cannot wait on another)
//   capture   the next run() synchronizes, empties the caching allocator, captures the step on
//             the capture stream into a private memory pool (thread-local capture mode, as
//             Megatron and torchtitan), then replays it once: that replay is this step
//   replay    every later run() replays the graph; the bucket all-reduces stay at their ready
//             points on the communication stream, forked from and joined to the capture stream
//             inside the graph, so overlap is kept
//
// What the step may do: read and write only tensors that live across steps (the static inputs the
// caller refills before each run(), the parameters, gradients, optimizer state); no host sync
// (.item(), .cpu(), a tensor built from host data), no host branch that changes between steps. A
// capture that breaks one of these fails: by default a warning naming the reason and eager steps
// from then on, or an error (CapturedStepOptions::error_on_fallback). Use the house's optimizers
// (optim/sgd.hpp, optim/adam.hpp: step count and learning rate on the device, set_lr between
// replays): torch::optim bakes its step count and learning rate into the graph. Drop or zero the
// gradients inside the step (optim::zero_grad): a graph's replays write the same buffers. Random
// draws (dropout) move on at every replay; graphs::StepRng makes them a function of the step, the
// same as an eager step's and a recaptured run's.
//
// Streams: run() makes the capture stream wait for the caller's current stream (the inputs were
// written there) and the current stream wait for the step, so the caller reads results in order.
// Run no backward of the model before the first run(): its AccumulateGrad nodes would remember
// the caller's stream instead of the capture stream.
//
// Timeout: a replayed collective is invisible to c10d's watchdog (work made under capture is not
// enqueued), so a dead or stopped rank would hang a replay forever. run() therefore waits, with
// `replay_timeout`, for the replay two steps back before launching the next (one replay queued
// behind the running one, so the GPU does not idle while the host launches), and throws naming
// the step whose replay did not finish. With `group` (the step's collectives' process group) the
// bound holds wherever the host waits (a loss read between replays blocks in a device sync that
// nothing else bounds): every replay is watched by the group's CollectiveWatchdog (NCCL), and a
// replay past the timeout ends the process naming the step and the rank that is behind, as an
// eager collective does (ProcessGroup::end_process_after_timeout).
//
// Inputs: a step reads its batch from tensors that stay put (a replay reads the captured
// addresses). Hand them to the constructor and feed each batch with run(batch): it copies the
// batch into them, on the caller's stream, after the previous step. A batch of another count or
// shape than the inputs is refused by exact text naming the step and the input: a graph replays
// fixed shapes (pad the last partial batch or drop it, or make one CapturedStep per shape).
//
// Refused, by exact text: a CPU device or a build without CUDA. Under capture the layers below
// refuse by name what a replay cannot repeat (DDP's find_unused_parameters without static_graph,
// Gloo): the capture then falls back as above. Destroy a CapturedStep before the process group its
// step uses (a graph holding NCCL work must go first).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp::comm {
class ProcessGroup;
}

namespace ddp::graphs {

struct CapturedStepOptions {
  // Eager steps on the capture stream before the capture; default 11, PyTorch's recipe for DDP
  // (notes/cuda "Usage with DistributedDataParallel"): the first step rebuilds the bucket plan,
  // the later ones run every collective and bucket size once more. At least 1.
  int warmup_steps = 11;
  // A capture that fails: false (default) warns once, naming the reason, and runs the step eagerly
  // from then on (training goes on, slower); true throws instead.
  bool error_on_fallback = false;
  // The longest the previous replay may take before run() gives up on it; default 5 minutes, as
  // long as the tools' collective timeout. A replay that hangs (a dead rank inside a replayed
  // collective) becomes an error naming the step within this time.
  std::chrono::milliseconds replay_timeout{std::chrono::minutes(5)};
  // The process group whose collectives the step replays; null (default): none named, and a
  // timeout is a thrown error seen at the next run(). Set it under NCCL (the tools do) so that a
  // stopped or dead rank ends the others, named, within the timeout wherever they wait.
  std::shared_ptr<comm::ProcessGroup> group;
};

// What one captured step holds: each node is one launch an eager step makes (a kernel, a copy, a
// memset) or a cross-stream dependency (an event); a replay launches them all with one call.
struct GraphCensus {
  int64_t kernels = 0;
  int64_t copies = 0;
  int64_t memsets = 0;
  int64_t other = 0;  // events, empty nodes, host nodes
};

class CapturedStep {
 public:
  // warming up -> replaying (capture succeeded) or eager (capture failed, fallback). Checked at
  // each transition.
  enum class State { kWarmingUp, kReplaying, kEager };

  // `step` runs one whole training step; `device` is where it runs (must be CUDA).
  CapturedStep(std::function<void()> step, c10::Device device, CapturedStepOptions options = {});
  // The same over static `inputs` (on `device`) that run(batch) refills before each step.
  CapturedStep(std::function<void()> step, std::vector<at::Tensor> inputs, c10::Device device,
               CapturedStepOptions options = {});
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // One step: eager while warming up, the capture and its first replay at the end of the warm-up,
  // a replay afterwards (or eager after a failed capture).
  void run();
  // Copies `batch` into the static inputs (each of its input's shape; any dtype or device that
  // copy_ takes), then run().
  void run(const std::vector<at::Tensor>& batch);

  State state() const;
  // Steps run so far (warm-up, replays and eager fallbacks together).
  int64_t steps() const;
  // Why the capture failed ("" while it has not).
  const std::string& fallback_reason() const;
  // The captured graph's nodes, counted at the capture (zeros before it or after a fallback).
  const GraphCensus& census() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Why `batch` cannot be copied into the static `inputs` of a captured step ("" when it can):
// another number of tensors, or one of another shape. Pure; run(batch) throws it naming the step.
std::string batch_mismatch(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& batch);

// "warming up", "replaying", "eager".
const char* state_name(CapturedStep::State state);
// "replaying: one launch per step for 412 kernels, 3 copies, 8 memsets (each one launch of an
// eager step)", or the state and the fallback reason.
std::string describe(const CapturedStep& step);

}  // namespace ddp::graphs
