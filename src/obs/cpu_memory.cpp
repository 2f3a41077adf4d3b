#include "ddp/obs/cpu_memory.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::obs {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_counted{false};
// The inner allocator's deleter of a bare pointer, and the size of every counted allocation by its
// pointer. A counted DataPtr stays simple (its context is its data): libtorch asserts that of a CPU
// allocation in places (Allocator::raw_allocate), so the size cannot ride in a context.
c10::DeleterFnPtr g_inner_delete = nullptr;
std::mutex g_sizes_mutex;
std::unordered_map<void*, int64_t>* g_sizes = nullptr;  // leaked: see count_cpu_memory

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

void free_counted(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_sizes_mutex);
    const auto it = g_sizes->find(data);
    if (it != g_sizes->end()) {
      g_current.fetch_sub(it->second, std::memory_order_relaxed);
      g_sizes->erase(it);
    }
  }
  g_inner_delete(data);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) DDP_ALLOCATOR_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    // Only simple allocations (context == data) are taken over; anything else stays uncounted.
    if (data == nullptr || inner.get_context() != data || inner.get_deleter() != g_inner_delete) {
      return inner;
    }
    const c10::Device device = inner.device();
    inner.release_context();  // the bare pointer is freed by free_counted from now on
    {
      std::lock_guard<std::mutex> lock(g_sizes_mutex);
      (*g_sizes)[data] = static_cast<int64_t>(n);
    }
    const int64_t bytes = static_cast<int64_t>(n);
    raise_peak(g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    return {data, data, &free_counted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

#if DDP_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* inner_;
};

}  // namespace

void count_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    g_inner_delete = inner->raw_deleter();
    if (g_inner_delete == nullptr) return;  // not a plain allocator: nothing can be counted
    // Leaked on purpose: storages counted by them may be freed after any static destructor ran.
    g_sizes = new std::unordered_map<void*, int64_t>();
    static auto* counting = new CountingAllocator(inner);
    // The highest priority, so that no later registration replaces it.
    c10::SetCPUAllocator(counting, /*priority=*/255);
    g_counted = true;
  });
}

bool cpu_memory_counted() { return g_counted; }

int64_t cpu_allocated_bytes() { return g_current.load(std::memory_order_relaxed); }

int64_t cpu_peak_allocated_bytes() { return g_peak.load(std::memory_order_relaxed); }

void reset_cpu_peak() { g_peak.store(g_current.load(std::memory_order_relaxed)); }

}  // namespace ddp::obs
