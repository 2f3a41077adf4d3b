#pragma once
// Runs a step of a multi-rank io operation (a checkpoint save or load, an export) on this rank,
// then agrees with the other ranks whether it failed anywhere, so that all of them stop together
// instead of the healthy ones waiting in the next collective until its timeout. Private to
// src/io.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "ddp/comm/control_scalars.hpp"
#include "ddp/comm/process_group.hpp"

namespace ddp::io::detail {

// How many ranks report `failed`: every rank learns the count.
inline int64_t count_failures(comm::ProcessGroup& group, bool failed, const std::string& what) {
  at::Tensor flag = comm::control_tensor(group, {failed ? 1 : 0});
  group.allreduce_sum(flag, what);
  return comm::read_scalar(flag);
}

// Runs `fn` on this rank, then counts the failures of all ranks (an all-reduce: also a barrier).
// This rank's own error is rethrown as it was; a healthy rank throws "ddp: <others_failed> on N
// rank(s) (their errors say why)".
template <typename Fn>
void on_every_rank(comm::ProcessGroup& group, const std::string& what,
                   const std::string& others_failed, Fn&& fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  const int64_t failures = count_failures(group, error != nullptr, what);
  if (error) std::rethrow_exception(error);
  TORCH_CHECK(failures == 0, "ddp: ", others_failed, " on ", failures,
              " rank(s) (their errors say why)");
}

}  // namespace ddp::io::detail
