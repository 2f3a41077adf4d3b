#include "ddp/comm/recorder/flight_ring.hpp"

#include <cstring>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

namespace ddp::comm {

namespace {

int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Every ring alive, in the order made: what a dump writes.
struct Registry {
  std::mutex mutex;
  std::vector<const FlightRing*> rings;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: a dump may run while statics are destroyed
  return *r;
}

}  // namespace

std::string CollectiveOp::describe() const {
  std::string text = kind;
  if (root >= 0) text += " from rank " + std::to_string(root);
  if (numel >= 0) {
    text += " of " + std::to_string(numel) + " " + c10::toString(dtype) + " elements";
  }
  return text;
}

int64_t CollectiveOp::wire_bytes(int world, bool emulated) const {
  if (world <= 1 || numel <= 0) return 0;
  const int64_t bytes = numel * int64_t(c10::elementSize(dtype));
  const int64_t n = world;
  const auto starts = [this](const char* prefix) {
    return std::strncmp(kind, prefix, std::strlen(prefix)) == 0;
  };
  if (starts("all-reduce")) return 2 * (n - 1) * bytes / n;
  if (starts("reduce-scatter")) return (emulated ? 2 : 1) * (n - 1) * bytes / n;
  if (starts("all-gather (flat)")) return (n - 1) * bytes / n;
  if (starts("all-gather")) return (n - 1) * bytes;
  if (starts("broadcast")) return bytes;
  return 0;
}

FlightRing::FlightRing(std::string name, int rank, std::vector<int> global_ranks, int64_t capacity)
    : name_(std::move(name)), rank_(rank), global_ranks_(std::move(global_ranks)) {
  TORCH_CHECK(capacity >= 0,
              "ddp: the flight recorder's capacity is a number of entries per group (0: off), got ",
              capacity);
  slots_.resize(static_cast<size_t>(capacity));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rings.push_back(this);
}

FlightRing::~FlightRing() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rings.erase(std::remove(r.rings.begin(), r.rings.end(), this), r.rings.end());
}

int64_t FlightRing::record(const void* work, const CollectiveOp& op, FlightState state) {
  if (slots_.empty()) {  // off: the numbering alone, as before the recorder
    std::lock_guard<std::mutex> lock(mutex_);
    return ++issued_;
  }
  const CollectivePurpose purpose = current_purpose();
  const int64_t step = current_step();
  const int64_t now = unix_us();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t seq = ++issued_;
  FlightEntry& e = slots_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(slots_.size()))];
  e = FlightEntry{seq, op, purpose, step, now, 0, work, state, -1};
  return seq;
}

void FlightRing::end(const void* work, FlightState state) {
  const int64_t now = unix_us();
  const auto capacity = static_cast<int64_t>(slots_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  // Newest first: the work waited for is almost always among the last few issued.
  for (int64_t seq = issued_; seq > std::max<int64_t>(0, issued_ - capacity); --seq) {
    FlightEntry& e = slots_[static_cast<size_t>((seq - 1) % capacity)];
    if (e.work == work && e.state == FlightState::kIssued) {
      e.state = state;
      e.ended_us = now;
      return;
    }
  }
}

int64_t FlightRing::issued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return issued_;
}

std::optional<FlightEntry> FlightRing::pending(const void* work) const {
  const auto capacity = static_cast<int64_t>(slots_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t seq = issued_; seq > std::max<int64_t>(0, issued_ - capacity); --seq) {
    const FlightEntry& e = slots_[static_cast<size_t>((seq - 1) % capacity)];
    if (e.state == FlightState::kIssued && (work == nullptr || e.work == work)) return e;
  }
  return std::nullopt;
}

std::optional<FlightEntry> FlightRing::newest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (issued_ == 0 || slots_.empty()) return std::nullopt;
  return slots_[static_cast<size_t>((issued_ - 1) % static_cast<int64_t>(slots_.size()))];
}

FlightGroup FlightRing::snapshot() const {
  FlightGroup g;
  g.name = name_;
  g.rank = rank_;
  g.global_ranks = global_ranks_;
  const auto capacity = static_cast<int64_t>(slots_.size());
  g.capacity = capacity;
  std::lock_guard<std::mutex> lock(mutex_);
  g.issued = issued_;
  for (int64_t seq = std::max<int64_t>(1, issued_ - capacity + 1); seq <= issued_; ++seq) {
    g.entries.push_back(slots_[static_cast<size_t>((seq - 1) % capacity)]);
  }
  return g;
}

CapturedCollectives FlightRing::capture_since(int64_t issued_before) {
  const auto capacity = static_cast<int64_t>(slots_.size());
  CapturedCollectives captured;
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t oldest = std::max<int64_t>(issued_before + 1, issued_ - capacity + 1);
  captured.lost = std::max<int64_t>(0, oldest - issued_before - 1);
  for (int64_t seq = oldest; seq <= issued_; ++seq) {
    FlightEntry& e = slots_[static_cast<size_t>((seq - 1) % capacity)];
    e.state = FlightState::kCaptured;
    captured.entries.push_back(e);
  }
  return captured;
}

int64_t FlightRing::record_replay(const CapturedCollectives& captured, int64_t replay) {
  const int64_t step = current_step();
  const int64_t now = unix_us();
  const auto capacity = static_cast<int64_t>(slots_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t first = issued_ + 1;
  if (capacity == 0) {
    issued_ += static_cast<int64_t>(captured.entries.size());
    return first;
  }
  for (const FlightEntry& c : captured.entries) {
    const int64_t seq = ++issued_;
    slots_[static_cast<size_t>((seq - 1) % capacity)] =
        FlightEntry{seq, c.op, c.purpose, step, now, 0, nullptr, FlightState::kIssued, replay};
  }
  return first;
}

void FlightRing::end_range(int64_t first, int64_t last, FlightState state) {
  const int64_t now = unix_us();
  const auto capacity = static_cast<int64_t>(slots_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t seq = std::max(first, issued_ - capacity + 1); seq <= std::min(last, issued_);
       ++seq) {
    FlightEntry& e = slots_[static_cast<size_t>((seq - 1) % capacity)];
    if (e.seq != seq || e.state != FlightState::kIssued) continue;
    e.state = state;
    e.ended_us = now;
  }
}

void for_each_flight_ring(const std::function<void(const FlightRing&)>& visit) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const FlightRing* ring : r.rings) visit(*ring);
}

}  // namespace ddp::comm
