#pragma once
// The communication-only floor of a step: the collectives one step issued on a group, read back
// from the group's flight ring (kind, element count, dtype, in issue order), issued again back to
// back with no compute between them, from a synchronized start to a synchronized end. A step
// cannot take less than this unless its collectives overlap one another; the compute-only floor
// is the same step with every collective a no-op (ddp-bench --no-comm, comm/fake_backend.hpp).

#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::tools {

struct CommFloor {
  double median_ms = 0;  // of the repeats, each the whole step's collectives
  int collectives = 0;   // replayed, per repeat
  int skipped = 0;       // issued by the step but not replayed (broadcasts, barriers, list gathers)
  int64_t bytes = 0;     // the replayed collectives' full tensors (gathered or reduced), per repeat
};

// Replays the collectives the group numbered first..last (inclusive; every one of them must still
// be in its ring) `repeats` times. Collective: every rank of the group calls it with the same
// range, as after the same step.
CommFloor comm_floor(comm::ProcessGroup& group, int64_t first, int64_t last, int repeats);

}  // namespace ddp::tools
