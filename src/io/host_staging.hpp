#pragma once
// Host copies of a checkpoint's tensors, made at a step boundary so that training may change the
// live tensors while a writer thread writes the copies (async_checkpointer.hpp). The buffers are
// kept for the next save, which has the same shapes. For tensors on a GPU, pinned host memory is
// fast to fill (33 GB/s on an H200) but slow to allocate (1.5 s for 2.3 GiB): a save without
// buffers yet fills pageable ones, and the writer thread pins them for the next save once its
// files are written (pin_for_next_save), so that no step waits for the allocation. Private to
// src/io.

#include <map>
#include <string>

#include "checkpoint_contents.hpp"

namespace ddp::io::detail {

class HostStaging {
 public:
  // `live` with every tensor replaced by its host copy (contiguous, same dtype and shape). One
  // tensor reached under two names (a tied weight) is copied once. Returns once the copies are
  // complete: the live tensors may change from then on.
  CheckpointContents stage(const CheckpointContents& live);

  // Replaces each pageable buffer that a GPU tensor was copied into by a pinned one of the same
  // shape, one at a time (the host holds one extra buffer at most). Not while stage() runs or
  // the copies are being written: the writer thread calls it after its files, and the next
  // stage() waits for that thread.
  void pin_for_next_save();

  // Bytes of host memory the buffers hold.
  int64_t bytes() const { return bytes_; }

 private:
  struct Buffer {
    at::Tensor tensor;
    bool wants_pinned = false;  // its source is on a GPU
  };
  // By "<file>/<tensor name>": the same tensor of the next save reuses its buffer when the shape
  // and dtype are unchanged.
  std::map<std::string, Buffer> buffers_;
  int64_t bytes_ = 0;
};

}  // namespace ddp::io::detail
