#include "ddp/comm/recorder/collective_check.hpp"

#include <c10/util/Exception.h>

#include <sstream>

#include "ddp/comm/recorder/flight_ring.hpp"

namespace ddp::comm {

namespace {

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// A slot's value: "<seq> <rank> <fingerprint>".
struct Offer {
  int64_t seq = -1;
  int rank = -1;
  std::string fingerprint;
};

Offer parse(const std::vector<uint8_t>& bytes) {
  const std::string text(bytes.begin(), bytes.end());
  Offer offer;
  std::istringstream in(text);
  in >> offer.seq >> offer.rank;
  if (!in) return Offer{};
  const size_t space = text.find(' ', text.find(' ') + 1);
  if (space != std::string::npos) offer.fingerprint = text.substr(space + 1);
  return offer;
}

}  // namespace

CollectiveCheck::CollectiveCheck(c10::intrusive_ptr<c10d::Store> store, int rank, std::string group)
    : store_(std::move(store)),
      rank_(rank),
      group_(std::move(group)),
      seen_(static_cast<size_t>(kSlots)) {
  TORCH_CHECK(store_, "ddp: the collective check needs the group's store");
}

std::string CollectiveCheck::fingerprint(const CollectiveOp& op, const CollectivePurpose& purpose) {
  return op.describe() + " for " + purpose.describe();
}

std::string CollectiveCheck::differs(const std::string& group, int64_t seq, int first_rank,
                                     const std::string& first, int rank, const std::string& mine) {
  return "collective #" + std::to_string(seq) + " of group " + group +
         " differs across ranks: rank " + std::to_string(first_rank) + " issued " + first +
         "; rank " + std::to_string(rank) + " was about to issue " + mine;
}

std::string CollectiveCheck::before(int64_t seq, const std::string& fingerprint) {
  const size_t slot = static_cast<size_t>(seq % kSlots);
  const std::string key = "check/" + std::to_string(slot);
  const std::string offer = std::to_string(seq) + " " + std::to_string(rank_) + " " + fingerprint;
  std::string expected = seen_[slot];
  Offer got;
  // At most three rounds: the usual one; a slot holding an older value this rank did not see (it
  // was replaced after this rank's last look); an absent key that the store answers with the
  // expected value (TCPStore's compareSet does so) retried as absent.
  for (int round = 0; round < 3; ++round) {
    const std::vector<uint8_t> answer =
        store_->compareSet(key, bytes_of(expected), bytes_of(offer));
    const std::string text(answer.begin(), answer.end());
    got = parse(answer);
    if (got.seq == seq) break;
    TORCH_CHECK(got.seq < seq || got.seq == -1, "ddp: the collective check of group ", group_,
                " found collective #", got.seq, " in the slot of #", seq, ": rank ", got.rank,
                " is more than ", kSlots, " collectives ahead of rank ", rank_);
    expected = text == expected ? std::string() : text;
  }
  TORCH_CHECK(got.seq == seq, "ddp: the collective check of group ", group_,
              " could not claim its store slot for collective #", seq);
  seen_[slot] = std::to_string(got.seq) + " " + std::to_string(got.rank) + " " + got.fingerprint;
  if (got.fingerprint == fingerprint) return "";
  const std::string sentence = differs(group_, seq, got.rank, got.fingerprint, rank_, fingerprint);
  try {
    // The first difference found stays: a later rank finding the same one does not replace it.
    store_->compareSet(differs_key(), {}, bytes_of(sentence));
  } catch (const std::exception&) {
    // The store is gone; this rank's error still says it.
  }
  return sentence;
}

}  // namespace ddp::comm
