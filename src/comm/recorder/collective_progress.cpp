#include "ddp/comm/recorder/collective_progress.hpp"

#include "ddp/comm/recorder/collective_check.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

namespace ddp::comm {

namespace {

// Under the group's store prefix ("ddp/world/progress/1"): each group numbers its own collectives.
std::string key_of(int rank) { return "progress/" + std::to_string(rank); }

// How long a failed wait reads the store for its report: rank 0 serves the store and may itself be
// the rank that is stopped, so the read is bounded and the error goes out without it.
constexpr std::chrono::seconds kReportBound{2};

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "1.0": the heartbeat's interval in seconds.
std::string every(std::chrono::milliseconds interval) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(interval.count()) / 1000.0);
  return text;
}

std::vector<int> identity_if_empty(std::vector<int> global_ranks, int world_size) {
  if (global_ranks.empty()) {
    for (int r = 0; r < world_size; ++r) global_ranks.push_back(r);
  }
  return global_ranks;
}

}  // namespace

namespace {

// "<issued> <unix ms>[ <state> <fingerprint>]": what a rank publishes of its progress.
std::string state_of(const FlightRing& ring) {
  const std::optional<FlightEntry> newest = ring.newest();
  const int64_t issued = newest ? newest->seq : ring.issued();
  std::string value = std::to_string(issued) + " " + std::to_string(unix_ms());
  if (newest) {
    std::string state = flight_state_name(newest->state);
    std::replace(state.begin(), state.end(), ' ', '_');
    value += " " + state + " " + CollectiveCheck::fingerprint(newest->op, newest->purpose);
  }
  return value;
}

// What a failed wait reads from the store: every rank's published state, and the collective
// check's finding. Runs on a thread of its own that holds only its copies, so that a store which
// never answers (rank 0 serves it, and may be the rank that is stopped) leaves it behind and
// nothing else.
struct StoreReading {
  std::vector<std::string> states;
  std::string check_found;  // "; the collective check found: ..." or ""
  std::string error;        // the store could not be read: why
};

StoreReading read_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                        const std::string& mine) {
  StoreReading r;
  r.states.resize(static_cast<size_t>(world_size));
  try {
    store->set(key_of(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int other = 0; other < world_size; ++other) {
      // check() does not wait: a rank that never published is reported as such.
      if (!store->check({key_of(other)})) continue;
      const auto bytes = store->get(key_of(other));
      r.states[static_cast<size_t>(other)] = std::string(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  try {
    if (store->check({CollectiveCheck::differs_key()})) {
      const auto bytes = store->get(CollectiveCheck::differs_key());
      r.check_found = "; the collective check found: " + std::string(bytes.begin(), bytes.end());
    }
  } catch (const std::exception&) {
    // The store is gone: the rest of the report stands.
  }
  return r;
}

}  // namespace

struct CollectiveProgress::Heartbeat {
  std::mutex mutex;  // guards stop and ended
  std::condition_variable cv;
  bool stop = false;   // set by the destructor
  bool ended = false;  // set by the thread as it leaves
  std::thread thread;
};

CollectiveProgress::CollectiveProgress(c10::intrusive_ptr<c10d::Store> store, int rank,
                                       int world_size, std::chrono::milliseconds interval,
                                       std::string name, std::vector<int> global_ranks,
                                       int64_t capacity)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      interval_(interval),
      ring_(std::make_shared<FlightRing>(std::move(name), rank,
                                         identity_if_empty(std::move(global_ranks), world_size),
                                         capacity)) {
  if (world_size_ <= 1 || !store_) return;
  heartbeat_ = std::make_shared<Heartbeat>();
  heartbeat_->thread = std::thread(
      [beat = heartbeat_, store = store_, rank = rank_, ring = ring_, interval = interval_] {
        std::unique_lock<std::mutex> lock(beat->mutex);
        while (!beat->stop) {
          lock.unlock();
          try {
            const std::string value = state_of(*ring);
            store->set(key_of(rank), std::vector<uint8_t>(value.begin(), value.end()));
          } catch (const std::exception&) {
            // The store is gone (rank 0 exited first at the end of a job): nothing to report to.
            lock.lock();
            break;
          }
          lock.lock();
          beat->cv.wait_for(lock, interval, [&] { return beat->stop; });
        }
        beat->ended = true;
        beat->cv.notify_all();
      });
}

CollectiveProgress::~CollectiveProgress() {
  if (!heartbeat_) return;
  std::unique_lock<std::mutex> lock(heartbeat_->mutex);
  heartbeat_->stop = true;
  heartbeat_->cv.notify_all();
  const bool ended =
      heartbeat_->cv.wait_for(lock, kReportBound, [this] { return heartbeat_->ended; });
  lock.unlock();
  if (ended) {
    heartbeat_->thread.join();
  } else {
    heartbeat_->thread.detach();  // stuck in the store; it holds only what it shares
  }
}

int64_t CollectiveProgress::issued(const c10d::Work* work, const CollectiveOp& op) {
  return ring_->record(work, op);
}

void CollectiveProgress::refused(const CollectiveOp& op) {
  ring_->record(nullptr, op, FlightState::kRefused);
}

void CollectiveProgress::done(const c10d::Work* work, FlightState state) {
  ring_->end(work, state);
}

int64_t CollectiveProgress::count() const { return ring_->issued(); }

std::string CollectiveProgress::describe(int64_t waiting_on, const std::string& op, int rank,
                                         const std::vector<std::string>& states, int64_t now_ms,
                                         std::chrono::milliseconds interval,
                                         const std::string& fingerprint) {
  std::ostringstream out;
  out << "; collective #" << waiting_on << " of rank " << rank;
  if (!op.empty()) out << " (" << op << ")";
  std::ostringstream behind, stale;
  for (size_t r = 0; r < states.size(); ++r) {
    if (static_cast<int>(r) == rank) continue;
    if (states[r].empty()) {
      behind << "; rank " << r << " never reported (it did not start, or died before its first "
             << "collective)";
      continue;
    }
    int64_t issued = 0, stamp = 0;
    std::string state, theirs;
    std::istringstream in(states[r]);
    in >> issued >> stamp >> state;
    std::getline(in >> std::ws, theirs);
    std::replace(state.begin(), state.end(), '_', ' ');
    const double age_s = static_cast<double>(now_ms - stamp) / 1000.0;
    char age[32];
    std::snprintf(age, sizeof(age), "%.1f", age_s < 0 ? 0.0 : age_s);
    const bool silent = now_ms - stamp > 3 * interval.count();
    if (issued < waiting_on) {
      // The count is as of the rank's last report, not now: said with its age, so that a rank
      // that ran on between reports and then stopped is not taken for one that never got there.
      behind << "; rank " << r << " is behind: it had issued " << issued
             << " collectives at its last report " << age << " s ago (reports every "
             << every(interval) << " s" << (silent ? "; silent since: dead or stopped" : "")
             << "), this rank waits on #" << waiting_on;
      if (!theirs.empty() && issued > 0) {
        behind << "; rank " << r << "'s last, #" << issued << " (" << theirs << "), "
               << (state == "issued" ? "still in flight" : state);
      }
    } else if (issued == waiting_on && !theirs.empty() && !fingerprint.empty() &&
               theirs != fingerprint) {
      // Both at the same number, with different collectives: the divergence itself.
      behind << "; rank " << r << " issued a different collective as #" << waiting_on << ": "
             << theirs << " (this rank: " << fingerprint << ")";
    } else if (silent) {
      stale << "; rank " << r << " reached #" << issued << " but last reported " << age
            << " s ago (dead or stopped)";
    }
  }
  const std::string who = behind.str() + stale.str();
  out << (who.empty() ? "; every rank reached this collective (a peer may have failed in it)"
                      : who);
  return out.str();
}

std::string CollectiveProgress::report(const c10d::Work* work) {
  int64_t seq = ring_->issued();
  std::string op, fingerprint;
  if (const std::optional<FlightEntry> entry = ring_->pending(work)) {
    seq = entry->seq;
    op = entry->op.describe();
    fingerprint = CollectiveCheck::fingerprint(entry->op, entry->purpose);
  }
  if (world_size_ == 1 || !store_) return "; collective #" + std::to_string(seq);
  const std::string here =
      "; collective #" + std::to_string(seq) + (op.empty() ? "" : " (" + op + ")");
  auto promise = std::make_shared<std::promise<StoreReading>>();
  std::future<StoreReading> reading = promise->get_future();
  std::thread([store = store_, rank = rank_, world = world_size_, mine = state_of(*ring_),
               promise] {
    promise->set_value(read_store(store, rank, world, mine));
  }).detach();
  if (reading.wait_for(kReportBound) != std::future_status::ready) {
    return here + "; the store did not answer within " + std::to_string(kReportBound.count()) +
           " s to say which rank is behind (rank 0 serves it: it may be the one stopped)";
  }
  const StoreReading r = reading.get();
  if (!r.error.empty()) return here + "; the store could not be read to compare ranks: " + r.error;
  return describe(seq, op, rank_, r.states, unix_ms(), interval_, fingerprint) + r.check_found;
}

}  // namespace ddp::comm
