#include "ddp/intake/replica_check.hpp"

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

}  // namespace ddp::intake
