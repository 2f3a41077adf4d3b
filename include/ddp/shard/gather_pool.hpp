#pragma once
// GatherPool: the buffers the units' all-gathers land in, shared by every unit of a model.
//
// A gathered output lives only from its all-gather's issue to its copy-out into the unit's full
// buffer (FlatParamGroup::unshard, [Note: flat shard layout]). The schedule issues the next unit's
// prefetch only after this unit's copy-out (UnitSchedule::gather, then prefetch_after), so one
// buffer of a unit's bytes, taken in turn, serves a whole step instead of one new output per
// gather: a step holds one unit of them, bounded, whatever the backend does with its
// collectives' tensors afterwards (Gloo's worker threads drop theirs some time after the wait
// returned, so freshly allocated outputs outlived their use at moments nobody controls). On CUDA
// the next all-gather, issued after the copy-out kernel was queued, waits for it (c10d makes the
// collective's stream wait on the current one). A gather that finds the buffer busy (a prefetch
// nobody consumed yet) gets a tensor of its own. Released between steps: then a rank holds its
// shards only. Except a registered buffer (NcclOptions::register_buffers: the group's
// empty_registered): it stays, as its memory belongs to the communicator's pool, which no other
// allocation uses, and a new one would be registered again (a collective call) every step.
//
// [Note: a buffer the unit's size] The buffer fits the unit that takes it: one over 1.25x the take
// is freed and made again at its size, so that an outsized unit (the untied Llama's embedding or
// output: 2.4x a block of llama-8b) does not leave its bytes held while the blocks run, as FSDP2's
// all-gather outputs are not held (the 1.25x keeps a shorter last layer from remaking it twice a
// step). A registered buffer only grows.
//
//   unit k:   take the buffer -> all-gather into it -> wait -> copy out -> give it back
//             -> prefetch unit k+1: take the buffer -> all-gather in flight while k computes
//   unit k+1: wait -> copy out -> give it back -> prefetch unit k+2 ...

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ddp::comm {
class ProcessGroup;
}

namespace ddp::shard {

class GatherPool {
 public:
  // Whether a taken output is the pool's buffer, and in which step (release() starts a new one, so
  // that a gather still in flight then cannot free the buffer taken since).
  struct Ticket {
    bool pooled = false;  // false: a tensor of its own, nothing to give back
    uint64_t epoch = 0;
  };

  // `numel` elements of `options`' dtype on its device: a view of the buffer (made by `group`'s
  // empty_registered at its first use since the last release, and made again where it is too small
  // or over 1.25x the take: [Note: a buffer the unit's size]), marked busy; a new tensor when the
  // buffer is busy. *ticket says which.
  at::Tensor take(int64_t numel, const at::TensorOptions& options, comm::ProcessGroup& group,
                  Ticket* ticket);
  // The gathered output of `ticket` was copied out (or discarded): the buffer is free again (if it
  // is still this step's). Resets the ticket.
  void give_back(Ticket* ticket);
  // Frees the buffer and marks it free (between steps; a gather still in flight keeps its own
  // reference to it until it is waited for).
  void release();
  // Bytes of the buffer allocated now.
  int64_t allocated_bytes() const { return buffer_.defined() ? buffer_.numel() : 0; }
  // Whether the buffer is memory the communicator registered (kept between steps).
  bool registered() const { return registered_; }

 private:
  at::Tensor buffer_;        // uint8, an 8-aligned size; undefined until first taken in a step
  bool busy_ = false;        // taken and not given back
  bool registered_ = false;  // buffer_ came from a group that registers buffers
  uint64_t epoch_ = 0;       // release() calls so far
};

}  // namespace ddp::shard
