#pragma once
// Before anything is broadcast, every rank must hold the same model: same parameter and buffer
// names, shapes and dtypes, in the same order. A mismatch becomes one clear error on every rank,
// naming the first mismatching entry and the ranks, instead of a hang or a silently wrong result.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::intake {

// One line per tensor: "<kind> <name> <shape> <dtype>".
std::vector<std::string> replica_signature(const std::vector<std::string>& names,
                                           const std::vector<at::Tensor>& tensors,
                                           const std::string& kind);

// Pure comparison of all ranks' signatures; returns "" when equal, else the error text.
std::string compare_signatures(const std::vector<std::vector<std::string>>& per_rank);

// Exchanges signatures through the process group's store and throws the comparison's error.
void verify_replicas(comm::ProcessGroup& pg, const std::vector<std::string>& signature);

// A tensor's values in two numbers, float64 [sum, sum of squares] (NaNs as 0), computed where the
// tensor lives: what the replica comparisons below compare.
at::Tensor checksum(const at::Tensor& t);

// For each of `checksums` (one per tensor, any device), on how many ranks it differs from rank
// 0's: one broadcast of rank 0's checksums and one all-reduce of the disagreements on the group's
// device, one host read, so every rank returns the same counts. Collective; `who` names it.
std::vector<int64_t> ranks_differing_from_rank0(comm::ProcessGroup& group,
                                                const std::vector<at::Tensor>& checksums,
                                                const std::string& who);

}  // namespace ddp::intake
