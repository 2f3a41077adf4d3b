#include "ddp/comm/collective_progress.hpp"

#include "ddp/comm/collective_check.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <sstream>

namespace ddp::comm {

namespace {

// Under the group's store prefix ("ddp/world/progress/1"): each group numbers its own collectives.
std::string key_of(int rank) { return "progress/" + std::to_string(rank); }

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace {

std::vector<int> identity_if_empty(std::vector<int> global_ranks, int world_size) {
  if (global_ranks.empty()) {
    for (int r = 0; r < world_size; ++r) global_ranks.push_back(r);
  }
  return global_ranks;
}

}  // namespace

CollectiveProgress::CollectiveProgress(c10::intrusive_ptr<c10d::Store> store, int rank,
                                       int world_size, std::chrono::milliseconds interval,
                                       std::string name, std::vector<int> global_ranks,
                                       int64_t capacity)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      interval_(interval),
      ring_(std::move(name), rank, identity_if_empty(std::move(global_ranks), world_size),
            capacity) {
  if (world_size_ > 1 && store_) heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

CollectiveProgress::~CollectiveProgress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

int64_t CollectiveProgress::issued(const c10d::Work* work, const CollectiveOp& op) {
  return ring_.record(work, op);
}

void CollectiveProgress::refused(const CollectiveOp& op) {
  ring_.record(nullptr, op, FlightState::kRefused);
}

void CollectiveProgress::done(const c10d::Work* work, FlightState state) { ring_.end(work, state); }

int64_t CollectiveProgress::count() const { return ring_.issued(); }

void CollectiveProgress::publish() {
  const std::optional<FlightEntry> newest = ring_.newest();
  const int64_t issued = newest ? newest->seq : ring_.issued();
  std::string value = std::to_string(issued) + " " + std::to_string(unix_ms());
  if (newest) {
    std::string state = flight_state_name(newest->state);
    std::replace(state.begin(), state.end(), ' ', '_');
    value += " " + state + " " + CollectiveCheck::fingerprint(newest->op, newest->purpose);
  }
  store_->set(key_of(rank_), std::vector<uint8_t>(value.begin(), value.end()));
}

void CollectiveProgress::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      publish();
    } catch (const std::exception&) {
      // The store is gone (rank 0 exited first at the end of a job): nothing left to report to.
      return;
    }
    lock.lock();
    stop_cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

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
      behind << "; rank " << r << " is behind: it issued " << issued
             << " collectives, this rank waits on #" << waiting_on << " (last report " << age
             << " s ago" << (silent ? ": it is dead or stuck outside collectives" : "") << ")";
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
            << " s ago (dead or stuck)";
    }
  }
  const std::string who = behind.str() + stale.str();
  out << (who.empty() ? "; every rank reached this collective (a peer may have failed in it)"
                      : who);
  return out.str();
}

std::string CollectiveProgress::report(const c10d::Work* work) {
  int64_t seq = ring_.issued();
  std::string op, fingerprint;
  if (const std::optional<FlightEntry> entry = ring_.pending(work)) {
    seq = entry->seq;
    op = entry->op.describe();
    fingerprint = CollectiveCheck::fingerprint(entry->op, entry->purpose);
  }
  if (world_size_ == 1 || !store_) return "; collective #" + std::to_string(seq);
  std::vector<std::string> states(static_cast<size_t>(world_size_));
  try {
    publish();
    for (int r = 0; r < world_size_; ++r) {
      // check() does not wait: a rank that never published is reported as such.
      if (!store_->check({key_of(r)})) continue;
      const auto bytes = store_->get(key_of(r));
      states[static_cast<size_t>(r)] = std::string(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    return "; collective #" + std::to_string(seq) + (op.empty() ? "" : " (" + op + ")") +
           "; the store could not be read to compare ranks: " + e.what();
  }
  return describe(seq, op, rank_, states, unix_ms(), interval_, fingerprint) + check_found();
}

std::string CollectiveProgress::check_found() const {
  try {
    if (!store_->check({CollectiveCheck::differs_key()})) return "";
    const auto bytes = store_->get(CollectiveCheck::differs_key());
    return "; the collective check found: " + std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    return "";  // the store is gone: the rest of the report stands
  }
}

}  // namespace ddp::comm
