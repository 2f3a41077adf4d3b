// Purposes in words: torch-free, shared by the recorder (libddp) and ddp-forensics.
#include <string>

#include "ddp/comm/flight_recorder.hpp"

namespace ddp::comm {

const char* purpose_name(Purpose purpose) {
  switch (purpose) {
    case Purpose::kUser:
      return "user";
    case Purpose::kBucket:
      return "bucket";
    case Purpose::kUnitGather:
      return "unit gather";
    case Purpose::kUnitReduce:
      return "unit reduce";
    case Purpose::kParamBroadcast:
      return "parameter broadcast";
    case Purpose::kCheckpoint:
      return "checkpoint";
    case Purpose::kControl:
      return "control";
    case Purpose::kCheck:
      return "check";
  }
  return "?";
}

std::string CollectivePurpose::describe() const {
  switch (what) {
    case Purpose::kBucket:
      return "bucket " + std::to_string(index) + " of plan epoch " + std::to_string(epoch);
    case Purpose::kUnitGather:
      return "unit " + std::to_string(index) + "'s parameters";
    case Purpose::kUnitReduce:
      return "unit " + std::to_string(index) + "'s gradients";
    case Purpose::kUser:
      return "the user's own call";
    default:
      return purpose_name(what);
  }
}

}  // namespace ddp::comm
