#pragma once
// GatherPool: the buffers the units' all-gathers land in, shared by every unit of a model.
//
// A gathered output lives only from its all-gather's issue to its copy-out into the unit's full
// buffer (FlatParamGroup::unshard, [Note: flat shard layout]). The schedule issues the next unit's
// prefetch only after this unit's copy-out (UnitSchedule::gather, then prefetch_after), so one
// buffer of the largest unit's bytes, taken in turn, serves a whole step instead of one new output
// per gather: a step holds one unit of them, bounded, whatever the backend does with its
// collectives' tensors afterwards (Gloo's worker threads drop theirs some time after the wait
// returned, so freshly allocated outputs outlived their use at moments nobody controls). On CUDA
// the next all-gather, issued after the copy-out kernel was queued, waits for it (c10d makes the
// collective's stream wait on the current one). A gather that finds the buffer busy (a prefetch
// nobody consumed yet) gets a tensor of its own. Released between steps: then a rank holds its
// shards only.
//
//   unit k:   take the slot -> all-gather into it -> wait -> copy out -> give it back
//             -> prefetch unit k+1: take the slot -> all-gather in flight while k computes
//   unit k+1: wait -> copy out -> give it back -> prefetch unit k+2 ...

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp::shard {

class GatherPool {
 public:
  // Which slot a taken buffer came from, and in which step (release() starts a new one, so that a
  // gather still in flight then cannot free a slot taken since).
  struct Ticket {
    int slot = -1;  // -1: a tensor of its own, nothing to give back
    uint64_t epoch = 0;
  };

  // `slots`: buffers taken in turn (1: see above; more for a deeper prefetch).
  explicit GatherPool(size_t slots = 1);

  // `numel` elements of `options`' dtype on its device, a view of a free slot's buffer (made or
  // grown to fit at its first use since the last release: the largest unit gathered so far)
  // marked busy, its slot in *ticket; a new tensor (ticket slot -1) when every slot is busy.
  at::Tensor take(int64_t numel, const at::TensorOptions& options, Ticket* ticket);
  // The gathered output of `ticket` was copied out (or discarded): its slot is free again (if it
  // is still this step's). Resets the ticket.
  void give_back(Ticket* ticket);
  // Frees every buffer and marks every slot free (between steps; a gather still in flight keeps
  // its own reference to its buffer until it is waited for).
  void release();
  // Bytes of the buffers allocated now.
  int64_t allocated_bytes() const;

 private:
  std::vector<at::Tensor> buffers_;  // uint8, 8-aligned sizes; undefined until first taken
  std::vector<bool> busy_;           // per slot: taken and not given back
  uint64_t epoch_ = 0;               // release() calls so far
};

}  // namespace ddp::shard
