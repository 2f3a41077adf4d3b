#pragma once
// FakeBackend: a c10d backend whose every collective is a no-op that completes at once, PyTorch's
// FakeProcessGroup natively. With it a rank runs a step's compute exactly as it would at its world
// size (the same shards, the same kernels, the same memory) with no communication at all: the
// compute-only floor of a step (ddp-bench --no-comm). Internal: its base class differs between
// libtorch versions (detail/torch_compat.hpp).
//
// What each collective leaves, so that a run can still be built and stepped (not trained):
//   all-reduce, broadcast, reduce-scatter, flat all-gather   the buffers as they were
//   list all-gather                                          this rank's input in every output,
//                                                            as if every rank held the same
//                                                            (construction's replica checks pass)
//   barrier                                                  nothing
// At world > 1 the results are wrong: a sharded unit gathers whatever its buffer held. Only time
// and memory mean anything.

#include "ddp/comm/made_backend.hpp"

namespace ddp::comm {

// A factory for ProcessGroup::Config::make_backend (sub-groups are fake too).
BackendFactory fake_backend_factory();

}  // namespace ddp::comm
