#include <gtest/gtest.h>

#include <sstream>

#include "support/oracle.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

struct Case {
  std::string model = "net";  // a workload name (make_test_workload)
  int world = 1;
  DDP_CASE_FIELDS(model)
};

// Three micro-batches per step, the first two under no_sync: the synchronized backward reduces
// the accumulated sum, so the result equals the oracle on all three global micro-batches.
DDP_TEST_WORKER_WITH(no_sync, Case, c) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.model = c.model;
  spec.dim = 32;  // small widths keep the test quick; the reduction path is the same
  spec.micro_batches = 3;
  spec.steps = 2;
  const TrainResult oracle = train_single(spec, pg->world_size());
  for (bool view : {true, false}) {
    parallel::DDPOptions options;
    options.gradients.gradient_as_bucket_view = view;
    options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
        buckets::mib_bytes(1e-3);
    const TrainResult got = train_ddp(spec, pg, options);
    std::ostringstream ctx;
    ctx << "no_sync " << spec.model << " view=" << view << " rank " << pg->rank();
    require_close(got.names, got.params, oracle.params, 1e-5, ctx.str());
  }
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " at world size " << c.world; }

DDP_WORKER_CASE_TEST(NoSync, AccumulatedMicroBatchesMatchTheOracle, no_sync, Case);

INSTANTIATE_TEST_SUITE_P(Models, NoSync,
                         ::testing::Values(Case{"net", 1}, Case{"net", 2}, Case{"net", 3},
                                           Case{"gpt", 2}, Case{"mlp", 3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name =
                               info.param.model + "_world" + std::to_string(info.param.world);
                           for (auto& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

}  // namespace
}  // namespace ddp::testing
