#include "ddp/intake/replica_check.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace ddp::intake {

std::vector<std::string> replica_signature(const std::vector<std::string>& names,
                                           const std::vector<at::Tensor>& tensors,
                                           const std::string& kind) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::ostringstream line;
    line << kind << " '" << names[i] << "' shape " << tensors[i].sizes() << " dtype "
         << tensors[i].scalar_type();
    lines.push_back(line.str());
  }
  return lines;
}

std::string compare_signatures(const std::vector<std::vector<std::string>>& per_rank) {
  if (per_rank.empty()) return "";
  const auto& ref = per_rank[0];
  for (size_t r = 1; r < per_rank.size(); ++r) {
    const auto& other = per_rank[r];
    const size_t common = std::min(ref.size(), other.size());
    for (size_t i = 0; i < common; ++i) {
      if (ref[i] != other[i]) {
        std::ostringstream msg;
        msg << "ddp: model replicas differ across ranks at entry " << i << ": rank 0 has " << ref[i]
            << ", rank " << r << " has " << other[i]
            << ". Every rank must construct the same model.";
        return msg.str();
      }
    }
    if (ref.size() != other.size()) {
      std::ostringstream msg;
      msg << "ddp: model replicas differ across ranks: rank 0 has " << ref.size()
          << " parameters and buffers, rank " << r << " has " << other.size()
          << "; the first one only rank " << (ref.size() > other.size() ? 0 : r) << " has is "
          << (ref.size() > other.size() ? ref[common] : other[common])
          << ". Every rank must construct the same model.";
      return msg.str();
    }
  }
  return "";
}

namespace {

std::string encode(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::vector<std::string> decode(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> lines;
  std::string cur;
  for (uint8_t c : bytes) {
    if (c == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(c));
    }
  }
  return lines;
}

}  // namespace

void verify_replicas(comm::ProcessGroup& pg, const std::vector<std::string>& signature) {
  // The store rather than a collective: signatures have different lengths on mismatched ranks,
  // and the store lets every rank see every other rank's full text. Keys are under the group's
  // store prefix (pg.store() is scoped), so sub-groups checking at once never read each other's.
  const std::string prefix = "replica_check/" + std::to_string(pg.next_exchange_id()) + "/";
  const std::string text = encode(signature);
  pg.store().set(prefix + std::to_string(pg.rank()),
                 std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::vector<std::string>> all;
  for (int r = 0; r < pg.world_size(); ++r) {
    try {
      all.push_back(decode(pg.store().get(prefix + std::to_string(r))));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "ddp: rank ", pg.rank(), " could not read rank ", r,
                  "'s model signature (timeout ", pg.timeout().count(), " ms; is rank ", r,
                  " alive and constructing DistributedDataParallel?): ", e.what());
    }
  }
  const std::string error = compare_signatures(all);
  TORCH_CHECK(error.empty(), error);
}

at::Tensor checksum(const at::Tensor& t) {
  const at::Tensor values = at::nan_to_num(t.detach().to(at::kDouble));
  return at::stack({values.sum(), values.square().sum()});
}

std::vector<int64_t> ranks_differing_from_rank0(comm::ProcessGroup& group,
                                                const std::vector<at::Tensor>& checksums,
                                                const std::string& who) {
  if (checksums.empty()) return {};
  // On the group's device (a control tensor's, comm/control_scalars.hpp): the sampled checksums of
  // deferred values are made on the host, so a model whose every value is deferred (a GPT under
  // fully_shard: no buffer) stacked them there, and NCCL refused the broadcast ("Tensors must be
  // CUDA and dense", 2x H200).
  const at::Device device = group.device();
  std::vector<at::Tensor> here;
  here.reserve(checksums.size());
  for (const at::Tensor& c : checksums) here.push_back(c.to(device));
  const at::Tensor mine = at::stack(here);
  at::Tensor reference = mine.clone();
  group.broadcast(reference, 0, who + ": checksum of rank 0's parameters and buffers");
  at::Tensor differs = mine.ne(reference).any(1).to(at::kDouble);
  group.allreduce_sum(differs, who + ": comparison of the parameter and buffer checksums");
  const at::Tensor counts = differs.to(at::kCPU);
  std::vector<int64_t> out;
  out.reserve(checksums.size());
  for (int64_t i = 0; i < counts.numel(); ++i) {
    out.push_back(static_cast<int64_t>(counts[i].item<double>()));
  }
  return out;
}

}  // namespace ddp::intake
