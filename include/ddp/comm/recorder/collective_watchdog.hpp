#pragma once
// CollectiveWatchdog: the bound on collectives that nobody waits for on the host.
//
// On NCCL a wait is a stream dependency (ProcessGroup::wait_on_stream): the host goes on, and a
// collective that never finishes (a peer stopped, killed or stuck outside collectives) blocks the
// process later, inside some device synchronization that has no timeout. c10d's own watchdog
// would end it, but only after a minute of "dumping debug info" and with an abort's stack trace,
// and without saying which rank is behind. This thread watches every collective a group issues
// outside a CUDA-graph capture (work made under capture has no event to poll; CapturedStep bounds
// its replays itself) and, once the oldest unfinished one has run `timeout` (or one ended in a
// failure, which on NCCL no host wait would ever rethrow), calls `expired` with it, once.
// ProcessGroup's `expired` writes the named error (which collective, which rank is behind: [Note:
// sequence numbers]) and ends the process, as c10d's asynchronous error handling does, but at the
// collective timeout and in our words.
//
//   host     issue #7 ... issue #8 ......................... (blocked in a sync, no timeout)
//   device   #7 done     #8 waits for the stopped peer ......
//   watchdog     poll      poll      poll ... #8 older than timeout -> expired(#8): error, exit
//
// Collectives finish in issue order on one communicator, so only the oldest needs polling; the
// finished ones are dropped from the front each poll. Cost on the hot path: one lock and one
// push per collective.
//
// Two threads, because a poll can block: while the issuing thread waits inside a kernel launch
// for a full launch queue (the GPU stuck behind a collective whose peer is stopped), CUDA calls
// from other threads wait with it (measured on 2x H200: a watchdog that polled and timed in one
// thread never fired, c10d's fired at its own timeout). The poller queries the oldest entry and
// may block; the clock only reads the time and the poller's verdicts, so it ends the process at
// the timeout whether or not the poller is stuck.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

class CollectiveWatchdog {
 public:
  // One thing that waits on collectives: a collective's work, or a replayed CUDA graph's end.
  struct Watched {
    // Polled by the thread: false while it runs, true once it ended; an end in failure also sets
    // *error to the failure's text.
    std::function<bool(std::string* error)> finished;
    // The collective, for the progress report; null: the newest collective (a graph's replay
    // holds collectives that have no c10d work; an event after a collective already waited for
    // holds none, so that the entry does not keep the work's tensors alive).
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;  // "a collective", "the replay of captured step 12": the error's subject
  };
  // Called on the watchdog's thread with the entry that ran past the timeout (`error` empty) or
  // ended in a failure nobody on the host will see (`error` its text), and how long it ran.
  using Expired =
      std::function<void(const Watched&, std::chrono::milliseconds, const std::string& error)>;

  // `timeout`: how long a collective may run; `poll`: how often the oldest is checked (the error
  // comes at most `poll` after the timeout).
  CollectiveWatchdog(std::chrono::milliseconds timeout, std::chrono::milliseconds poll,
                     Expired expired);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Starts the clock of `work` (just issued).
  void watch(c10::intrusive_ptr<c10d::Work> work);
  // Starts the clock of anything else that ends when collectives do (issued in order with them).
  void watch(Watched watched);
  // Collectives issued and not yet seen finished.
  size_t watched() const;
  // Blocks until every watched collective has finished (the group's destructor: a communicator
  // must not be shut down under a running collective). One that expires meanwhile calls
  // `expired`, whose ProcessGroup action never returns; if it does, so does this.
  void wait_idle();

 private:
  struct Entry {
    Watched watched;
    std::chrono::steady_clock::time_point since;  // when watch() was called
  };
  void poll_loop();   // the poller: queries the oldest entry, drops it once finished
  void clock_loop();  // the clock: expires the oldest entry by its age or a failure
  bool wait_tick(std::unique_lock<std::mutex>& lock);  // false once stopping

  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds poll_;
  const Expired expired_;
  mutable std::mutex mutex_;
  // Issued and not yet seen finished, oldest first. Filled by watch(), drained from the front by
  // the poller; an entry holds a reference so the work outlives its caller's.
  std::deque<std::shared_ptr<Entry>> works_;
  // Set by the poller when the oldest ended in a failure (its text in failure_): the clock expires
  // it at its next tick.
  std::shared_ptr<Entry> failed_;
  std::string failure_;
  std::condition_variable tick_cv_;
  bool stop_ = false;         // set by the destructor; the threads exit at their next wake-up
  bool expired_ran_ = false;  // the clock called `expired` and ended the watch
  std::condition_variable idle_cv_;  // notified when works_ empties or the watch ends
  std::thread poller_, clock_;
};

}  // namespace ddp::comm
