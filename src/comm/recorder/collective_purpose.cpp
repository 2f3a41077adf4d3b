// The recorder's words (purposes, states): torch-free, shared by the recorder (libddp) and
// ddp-forensics, so that the dumps and their reader name things from one list.
#include <string>

#include "ddp/comm/recorder/flight_recorder.hpp"

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
    case Purpose::kBufferBroadcast:
      return "buffer broadcast";
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
    case Purpose::kParamBroadcast:
      return "rank 0's parameters and buffers";
    case Purpose::kBufferBroadcast:
      return "rank 0's buffers";
    default:
      return purpose_name(what);
  }
}

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::kIssued:
      return "issued";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
    case FlightState::kTimedOut:
      return "timed out";
    case FlightState::kRefused:
      return "refused";
    case FlightState::kCaptured:
      return "captured";
  }
  return "?";
}

}  // namespace ddp::comm
