// CollectiveWatchdog: a collective nobody waits for on the host (what NCCL's stream waits leave
// behind) still ends the job at the collective timeout, naming the rank that is behind.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "ddp/comm/init.hpp"
#include "ddp/comm/recorder/collective_watchdog.hpp"
#include "support/param_names.hpp"
#include "support/temp_dir.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using comm::CollectiveWatchdog;
using std::chrono::milliseconds;

// A watched entry whose state the test sets.
struct Switch {
  std::atomic<bool> done{false};
  std::string error;  // set before done
  CollectiveWatchdog::Watched watched(const std::string& what) {
    return {[this](std::string* e) {
              if (!done) return false;
              *e = error;
              return true;
            },
            {},
            what};
  }
};

TEST(CollectiveWatchdog, FinishedWorkIsForgottenAndNothingExpires) {
  std::atomic<int> expired{0};
  CollectiveWatchdog dog(milliseconds(200), milliseconds(5),
                         [&](const auto&, milliseconds, const std::string&) { ++expired; });
  Switch a, b;
  dog.watch(a.watched("a"));
  dog.watch(b.watched("b"));
  EXPECT_EQ(dog.watched(), 2u);
  a.done = true;
  b.done = true;
  dog.wait_idle();  // returns once the thread has dropped both
  EXPECT_EQ(dog.watched(), 0u);
  EXPECT_EQ(expired.load(), 0);
}

TEST(CollectiveWatchdog, TheOldestUnfinishedExpiresOnceAfterTheTimeout) {
  std::mutex mutex;
  std::vector<std::string> seen;
  milliseconds age{0};
  const auto start = std::chrono::steady_clock::now();
  CollectiveWatchdog dog(
      milliseconds(100), milliseconds(5),
      [&](const CollectiveWatchdog::Watched& w, milliseconds waited, const std::string& error) {
        std::lock_guard<std::mutex> lock(mutex);
        seen.push_back(w.what + "|" + error);
        age = waited;
      });
  Switch first, second;
  first.done = true;
  dog.watch(first.watched("first"));
  dog.watch(second.watched("second"));  // never finishes
  dog.wait_idle();                      // returns once the expiry ran
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "second|");
  EXPECT_GE(age.count(), 100);
}

// What a finished entry holds may block as it is destroyed (a CUDA event while the device is stuck
// behind a collective that never ends, as with a SIGSTOPped NCCL peer): the clock still names the
// unfinished one at the timeout. (It did not when the entry went under the watchdog's lock.)
TEST(CollectiveWatchdog, AFinishedEntryWhoseEndBlocksDoesNotStopTheClock) {
  struct Blocker {
    std::mutex mutex;
    std::condition_variable cv;
    bool released = false;
  };
  auto blocker = std::make_shared<Blocker>();
  struct BlocksWhenDestroyed {
    explicit BlocksWhenDestroyed(std::shared_ptr<Blocker> blocker) : b(std::move(blocker)) {}
    BlocksWhenDestroyed(const BlocksWhenDestroyed&) = delete;
    std::shared_ptr<Blocker> b;
    ~BlocksWhenDestroyed() {
      std::unique_lock<std::mutex> lock(b->mutex);
      b->cv.wait(lock, [&] { return b->released; });
    }
  };
  std::mutex mutex;
  std::condition_variable expired_cv;
  std::string expired_what;
  std::atomic<bool> finished{false};
  Switch stuck;  // both outlive the watchdog, whose threads read them
  {
    CollectiveWatchdog dog(
        milliseconds(100), milliseconds(5),
        [&](const CollectiveWatchdog::Watched& w, milliseconds, const std::string&) {
          std::lock_guard<std::mutex> lock(mutex);
          expired_what = w.what;
          expired_cv.notify_all();
        });
    auto held = std::make_shared<BlocksWhenDestroyed>(blocker);
    dog.watch({[held, &finished](std::string*) { return finished.load(); },
               {},
               "finished, its end blocks"});
    held.reset();  // the entry holds the last reference now
    finished = true;
    dog.watch(stuck.watched("the stuck one"));
    {
      std::unique_lock<std::mutex> lock(mutex);
      expired_cv.wait_for(lock, std::chrono::seconds(10), [&] { return !expired_what.empty(); });
    }
    EXPECT_EQ(expired_what, "the stuck one");
    {
      std::lock_guard<std::mutex> lock(blocker->mutex);
      blocker->released = true;
    }
    blocker->cv.notify_all();
    stuck.done = true;
  }
}

TEST(CollectiveWatchdog, AFailureExpiresAtOnceWithItsText) {
  std::string seen;
  CollectiveWatchdog dog(milliseconds(60000), milliseconds(5),
                         [&](const CollectiveWatchdog::Watched& w, milliseconds,
                             const std::string& error) { seen = w.what + "|" + error; });
  Switch failing;
  failing.error = "peer closed the connection";
  failing.done = true;
  dog.watch(failing.watched("a collective"));
  dog.wait_idle();  // long before the 60 s timeout
  EXPECT_EQ(seen, "a collective|peer closed the connection");
}

TEST(CollectiveWatchdog, RefusesANonPositiveTimeout) {
  EXPECT_THROW(CollectiveWatchdog(milliseconds(0), milliseconds(5),
                                  [](const auto&, milliseconds, const std::string&) {}),
               c10::Error);
}

// Every rank runs collective #1; rank 1 then stops issuing (it waits on the store, as a rank stuck
// in its own code would), while rank 0 issues #2 and never waits for it on the host, as a
// collective on NCCL's stream. With watch_collectives on, a waiting rank's process must end with
// exit code 124 and, on stderr, the error naming the collective and rank 1.
struct WatchdogCase {
  std::string dir;  // where each rank's stderr goes (stderr.<rank>)
  DDP_CASE_FIELDS(dir)
};

DDP_TEST_WORKER_WITH(watchdog, WatchdogCase, c) {
  // stderr into a file the parent reads: the process ends without returning to the harness.
  const std::string path = c.dir + "/stderr." + worker_env("RANK");
  require(std::freopen(path.c_str(), "w", stderr) != nullptr, "cannot open " + path);
  comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = milliseconds(1500);
  options.rendezvous_timeout = std::chrono::seconds(60);
  options.watch_collectives = true;
  auto pg = comm::init_process_group(options);
  auto t = torch::ones({4});
  pg->allreduce_sum(t, "first all-reduce");
  if (pg->rank() == 1) {
    // Bounded; ends when rank 0's process (and its store) goes, or the launcher stops it.
    try {
      pg->store().wait({"test/never"}, std::chrono::seconds(60));
    } catch (const std::exception&) {
    }
    return;
  }
  auto work = pg->allreduce_sum_async(t);  // #2: never waited for (rank 0, and rank 2 at world 3)
  try {
    pg->store().wait({"test/never"}, std::chrono::seconds(60));
  } catch (const std::exception&) {
  }
  require(false, "the watchdog did not end the process");
}

class CollectiveWatchdogWorkers : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveWatchdogWorkers, AnUnwaitedCollectiveEndsTheProcessNamingTheRankBehind) {
  TempDir dir("ddp_watchdog");
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_workers(watchdog, GetParam(), WatchdogCase{dir.str()},
                                  {{"DDP_HEARTBEAT_MS", "100"}}, std::chrono::seconds(90));
  // The 1.5 s timeout plus start-up, far from the 60 s store waits.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(45));
  ASSERT_EQ(result.workers.size(), static_cast<size_t>(GetParam()));
  // Every rank but 1 waits on #2, and whichever watchdog fires first ends its rank (the launcher
  // then stops the others). Rank 0 serves the store, so its report is whole; rank 2's is whole
  // when it ended first, and may find the store gone when rank 0 ended in the same instant.
  int ended = -1;
  for (int r = GetParam() - 1; r >= 0; --r) {
    if (r != 1 && result.workers[r].exit_code == comm::kCollectiveTimeoutExitCode) ended = r;
  }
  ASSERT_GE(ended, 0) << "no rank ended with exit code 124: " << result.describe();
  std::ifstream in(dir.file("stderr." + std::to_string(ended)));
  std::stringstream text;
  text << in.rdbuf();
  const std::string error = text.str();
  const std::string r = std::to_string(ended);
  // Gloo ends the unwaited all-reduce with its own timeout error at 1.5 s (NCCL would leave it
  // running: "did not finish within"); either way the process ends naming rank 1.
  EXPECT_NE(error.find("ddp: rank " + r + ": a collective "), std::string::npos) << error;
  EXPECT_NE(error.find("(collective timeout 1500 ms; collective #2 of rank " + r +
                       " (all-reduce (sum) of 4 Float elements); rank 1 is behind: it had issued 1 "
                       "collectives at its last report "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(" s), this rank waits on #2"), std::string::npos) << error;
  EXPECT_NE(error.find("; ending the process with exit code 124"), std::string::npos) << error;
}

// Rank 1 lags at world 2 and 3 (at 3, rank 2 waits on #2 beside rank 0).
INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectiveWatchdogWorkers, ::testing::Values(2, 3),
                         ddp::testing::world_name);

}  // namespace
}  // namespace ddp::testing
