#include "ddp/graphs/captured_step.hpp"

#include <c10/util/Exception.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/detail/torch_compat.hpp"
#include "ddp/obs/log.hpp"

#if DDP_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ddp::graphs {

const char* state_name(CapturedStep::State state) {
  switch (state) {
    case CapturedStep::State::kWarmingUp:
      return "warming up";
    case CapturedStep::State::kReplaying:
      return "replaying";
    case CapturedStep::State::kEager:
      return "eager";
  }
  return "?";
}

std::string batch_mismatch(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& batch) {
  if (batch.size() != inputs.size()) {
    return std::to_string(batch.size()) + " batch tensors given, but the step reads " +
           std::to_string(inputs.size()) + " inputs";
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (batch[i].sizes() == inputs[i].sizes()) continue;
    std::ostringstream out;
    out << "input " << i << " has shape " << batch[i].sizes() << ", but the captured step reads "
        << inputs[i].sizes()
        << ": a replay reads fixed shapes (pad the last partial batch or drop it, or make one "
           "CapturedStep per shape)";
    return out.str();
  }
  return "";
}

#if DDP_HAVE_CUDA_GRAPHS

struct CapturedStep::Impl {
  std::function<void()> step;
  std::vector<at::Tensor> inputs;  // static: refilled by run(batch), read by every replay
  c10::Device device;
  CapturedStepOptions options;
  c10::cuda::CUDAStream stream;  // the capture stream: warm-up, capture and replays run on it
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  // Recorded after each replay, in turn: a replay waits for the one two replays back, so one
  // replay stays queued behind the running one and the GPU never waits for the host's launch.
  std::array<at::cuda::CUDAEvent, 2> replayed;
  std::array<int64_t, 2> replayed_step{-1, -1};  // the step each event marks; -1: none pending
  int64_t replays = 0;
  at::cuda::CUDAEvent inputs_ready, done;  // the fork from and the join to the caller's stream
  State state = State::kWarmingUp;
  int64_t steps = 0;
  std::string fallback_reason;
  GraphCensus census;
  // A replay ran past replay_timeout: it may never end, so the destructor must not wait for it.
  bool timed_out = false;
  // The group's collectives the capture recorded (null: no group, or not captured yet); each
  // replay records them again in the group's flight recorder, from replay_first[slot] on.
  std::shared_ptr<const comm::CapturedCollectives> collectives;
  std::array<int64_t, 2> replay_first{0, 0};

  Impl(std::function<void()> s, std::vector<at::Tensor> in, c10::Device d, CapturedStepOptions o)
      : step(std::move(s)),
        inputs(std::move(in)),
        device(d),
        options(o),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  // Runs `body` on the capture stream, ordered after the caller's stream and before its later
  // work.
  template <typename Body>
  void on_capture_stream(Body body) {
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    inputs_ready.record(caller);
    inputs_ready.block(stream);
    {
      const c10::cuda::CUDAStreamGuard guard(stream);
      body();
    }
    done.record(stream);
    done.block(caller);
  }

  // Waits, bounded, for the replay that `slot` marks: the host-side timeout c10d cannot give
  // replayed collectives. Polls without backing off: a launch-bound replay ends within
  // microseconds of the poll that sees it; after 2 ms of yielding it sleeps 100 us per poll.
  void wait_for_replay(size_t slot) {
    if (replayed_step[slot] < 0) return;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + options.replay_timeout;
    while (!replayed[slot].query()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        timed_out = true;
        replay_ended(slot, /*completed=*/false);
        const std::string what =
            "the replay of captured step " + std::to_string(replayed_step[slot]);
        if (options.group) {
          options.group->end_process_after_timeout(
              what, nullptr, std::chrono::duration_cast<std::chrono::milliseconds>(now - start));
        }
        TORCH_CHECK(false, "ddp: captured step ", steps, ": ", what, " did not finish within ",
                    options.replay_timeout.count(),
                    " ms (a collective inside it waits on a rank that is dead or stopped?)");
      }
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    replay_ended(slot, /*completed=*/true);
    replayed_step[slot] = -1;
  }

  // The flight recorder learns how the replay `slot` marks ended.
  void replay_ended(size_t slot, bool completed) {
    if (collectives) options.group->replay_ended(*collectives, replay_first[slot], completed);
  }

  void replay() {
    const size_t slot = static_cast<size_t>(replays % 2);
    wait_for_replay(slot);
    if (collectives) replay_first[slot] = options.group->record_replay(*collectives, steps);
    on_capture_stream([&] {
      graph->replay();
      replayed[slot].record(stream);
      if (options.group) {
        // Its own event: the slot's is recorded again two replays later, while the watchdog may
        // not yet have polled this one. The watchdog's thread has no current device.
        auto end = std::make_shared<at::cuda::CUDAEvent>();
        end->record(stream);
        const c10::Device d = device;
        options.group->watch(
            [end, d] {
              const c10::cuda::CUDAGuard guard(d);
              return end->query();
            },
            "the replay of captured step " + std::to_string(steps));
      }
    });
    replayed_step[slot] = steps;
    ++replays;
  }

  // Counts the nodes of the graph being captured (before capture_end hands it to CUDAGraph).
  void count_nodes() {
    cudaStreamCaptureStatus status{};
    unsigned long long id = 0;
    cudaGraph_t captured = nullptr;
    if (cudaStreamGetCaptureInfo(stream.stream(), &status, &id, &captured) != cudaSuccess ||
        status != cudaStreamCaptureStatusActive || captured == nullptr) {
      (void)cudaGetLastError();
      return;
    }
    size_t n = 0;
    if (cudaGraphGetNodes(captured, nullptr, &n) != cudaSuccess) return;
    std::vector<cudaGraphNode_t> nodes(n);
    if (cudaGraphGetNodes(captured, nodes.data(), &n) != cudaSuccess) return;
    census = {};
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      (void)cudaGraphNodeGetType(node, &type);
      if (type == cudaGraphNodeTypeKernel) {
        ++census.kernels;
      } else if (type == cudaGraphNodeTypeMemcpy) {
        ++census.copies;
      } else if (type == cudaGraphNodeTypeMemset) {
        ++census.memsets;
      } else {
        ++census.other;
      }
    }
  }

  // The capture, then its first replay (a capture records work without running it). A failure
  // ends the capture, drops the graph and returns its reason.
  std::string capture() {
    const int64_t issued_before = options.group ? options.group->collectives_issued() : 0;
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph = std::make_unique<at::cuda::CUDAGraph>();
    std::string reason;
    on_capture_stream([&] {
      graph->capture_begin(at::cuda::graph_pool_handle(), cudaStreamCaptureModeThreadLocal);
      try {
        step();
      } catch (const c10::Error& e) {
        reason = e.what_without_backtrace();
      } catch (const std::exception& e) {
        reason = e.what();
      }
      if (reason.empty()) {
        count_nodes();
        try {
          graph->capture_end();
        } catch (const c10::Error& e) {
          reason = e.what_without_backtrace();
        }
      } else {
        // End the failed capture so that the stream can run eagerly again: through CUDAGraph
        // while the capture is still valid (a step that threw before any illegal CUDA call, such
        // as the checkpoint's refusal of a block that draws), since only its end also takes the
        // generators out of capture mode (else the next eager draw fails with "Offset increment
        // outside graph capture encountered unexpectedly", measured on torch 2.11) and stops the
        // allocator routing into the graph's pool; by hand when CUDA already invalidated it.
        bool ended = false;
        try {
          graph->capture_end();
          ended = true;
        } catch (const c10::Error&) {
        }
        if (!ended) {
          cudaGraph_t broken = nullptr;
          (void)cudaStreamEndCapture(stream.stream(), &broken);
          if (broken != nullptr) (void)cudaGraphDestroy(broken);
        }
        (void)cudaGetLastError();
      }
    });
    if (!reason.empty()) {
      graph.reset();
      return reason;
    }
    if (options.group) collectives = options.group->captured_since(issued_before);
    return "";
  }
};

CapturedStep::CapturedStep(std::function<void()> step, c10::Device device,
                           CapturedStepOptions options)
    : CapturedStep(std::move(step), {}, device, options) {}

CapturedStep::CapturedStep(std::function<void()> step, std::vector<at::Tensor> inputs,
                           c10::Device device, CapturedStepOptions options) {
  TORCH_CHECK(device.is_cuda(), "ddp: a captured step (--cuda-graph) needs a CUDA device, not ",
              device, ": CUDA graphs capture GPU work only");
  TORCH_CHECK(options.warmup_steps >= 1, "ddp: CapturedStepOptions::warmup_steps is ",
              options.warmup_steps, "; at least 1 eager step must run before the capture");
  TORCH_CHECK(options.replay_timeout.count() > 0, "ddp: CapturedStepOptions::replay_timeout is ",
              options.replay_timeout.count(), " ms; it must be positive");
  TORCH_CHECK(step != nullptr, "ddp: a captured step needs a step function");
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].defined() && inputs[i].device() == device,
                "ddp: a captured step's input ", i, " must be a tensor on ", device,
                ", where the step runs");
  }
  impl_ = std::make_unique<Impl>(std::move(step), std::move(inputs), device, options);
}

void CapturedStep::run(const std::vector<at::Tensor>& batch) {
  const std::string wrong = batch_mismatch(impl_->inputs, batch);
  TORCH_CHECK(wrong.empty(), "ddp: captured step ", impl_->steps, ": ", wrong);
  {
    // On the caller's stream, which waits for the previous step (run() joins it back there).
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < batch.size(); ++i)
      impl_->inputs[i].copy_(batch[i], /*non_blocking=*/true);
  }
  run();
}

CapturedStep::~CapturedStep() {
  if (!impl_ || impl_->timed_out) return;
  for (size_t slot = 0; slot < impl_->replayed.size(); ++slot) {
    if (impl_->replayed_step[slot] < 0) continue;
    try {
      impl_->replayed[slot].synchronize();
      impl_->replay_ended(slot, /*completed=*/true);
    } catch (...) {
      // Destruction must not throw; the graph goes with impl_.
    }
  }
}

void CapturedStep::run() {
  Impl& s = *impl_;
  switch (s.state) {
    case State::kWarmingUp:
      if (s.steps < s.options.warmup_steps) {
        s.on_capture_stream(s.step);
        break;
      }
      s.fallback_reason = s.capture();
      if (s.fallback_reason.empty()) {
        s.state = State::kReplaying;
        s.replay();
      } else {
        TORCH_CHECK(!s.options.error_on_fallback,
                    "ddp: the step could not be captured in a CUDA "
                    "graph: ",
                    s.fallback_reason);
        s.state = State::kEager;
        obs::log(obs::LogLevel::kWarn, 0,
                 "ddp: warning: the step could not be captured in a CUDA graph, so it runs "
                 "eagerly from now on: " +
                     s.fallback_reason);
        s.on_capture_stream(s.step);
      }
      break;
    case State::kReplaying:
      s.replay();
      break;
    case State::kEager:
      s.on_capture_stream(s.step);
      break;
  }
  ++s.steps;
}

#else  // no CUDA in this libtorch

struct CapturedStep::Impl {
  State state = State::kWarmingUp;
  int64_t steps = 0;
  std::string fallback_reason;
  GraphCensus census;
};

CapturedStep::CapturedStep(std::function<void()> step, c10::Device device,
                           CapturedStepOptions options)
    : CapturedStep(std::move(step), {}, device, options) {}

CapturedStep::CapturedStep(std::function<void()>, std::vector<at::Tensor>, c10::Device device,
                           CapturedStepOptions) {
  TORCH_CHECK(device.is_cuda(), "ddp: a captured step (--cuda-graph) needs a CUDA device, not ",
              device, ": CUDA graphs capture GPU work only");
  TORCH_CHECK(false,
              "ddp: a captured step (--cuda-graph) needs a CUDA build of libtorch; this "
              "libddp was built against one without CUDA");
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::run() { TORCH_CHECK(false, "ddp: a captured step needs CUDA"); }
void CapturedStep::run(const std::vector<at::Tensor>&) { run(); }

#endif

CapturedStep::State CapturedStep::state() const { return impl_->state; }
int64_t CapturedStep::steps() const { return impl_->steps; }
const std::string& CapturedStep::fallback_reason() const { return impl_->fallback_reason; }
const GraphCensus& CapturedStep::census() const { return impl_->census; }

std::string describe(const CapturedStep& step) {
  std::string out = state_name(step.state());
  if (!step.fallback_reason().empty()) return out + ": " + step.fallback_reason();
  if (step.state() != CapturedStep::State::kReplaying) return out;
  const GraphCensus& c = step.census();
  return out + ": one launch per step for " + std::to_string(c.kernels) + " kernels, " +
         std::to_string(c.copies) + " copies, " + std::to_string(c.memsets) +
         " memsets (each one launch of an eager step), " + std::to_string(c.other) + " other nodes";
}

}  // namespace ddp::graphs
