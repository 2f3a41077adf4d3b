#pragma once
// CPU tensor memory, counted: the CPU's answer to the CUDA caching allocator's statistics, so that
// a step's memory is measured the same way on both (ddp-bench --verbose / --json, the sharded
// styles' memory tests). count_cpu_memory() puts a counting allocator in front of libtorch's CPU
// allocator; from then on every CPU tensor storage allocated is counted until it is freed.
// glibc's own counters (mallinfo2) also count the autograd engine's, Gloo's and the allocator's
// bookkeeping and free lists, which vary between runs by more than a sharded unit: these count
// tensor bytes only. Storages allocated before the call are not counted (nor their frees).

#include <cstdint>

namespace ddp::obs {

// Installs the counting allocator (once per process; later calls do nothing).
void count_cpu_memory();
// Whether count_cpu_memory() ran.
bool cpu_memory_counted();
// Bytes of counted CPU storages alive now, and the most alive at once since the last reset.
int64_t cpu_allocated_bytes();
int64_t cpu_peak_allocated_bytes();
// The peak starts again from the bytes alive now.
void reset_cpu_peak();

}  // namespace ddp::obs
