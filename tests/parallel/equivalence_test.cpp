#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "support/oracle.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

struct Case {
  std::string model = "net";  // a workload name (make_test_workload)
  int64_t dim = 0;            // its width; 0: its default
  int world = 1;
  DDP_CASE_FIELDS(model, dim)
};

// For one model: SGD and Adam x bucket views on/off x tiny/default caps, each K steps, every
// rank's parameters against the single-process oracle on the concatenated batch.
DDP_TEST_WORKER_WITH(equivalence, Case, c) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.model = c.model;
  spec.dim = c.dim;
  // Adam divides by sqrt(v): a parameter whose true gradient is exactly zero (attention's key
  // bias, a bias right before BatchNorm) gets full-size updates from fp32 rounding noise, which
  // differs between any two summation orders. That is Adam's conditioning, not the reduction's;
  // those models are checked with SGD, whose update is linear in the gradient. The Llama's
  // embedding rows of tokens seen once or twice get gradients near that noise too (Adam: 1.1e-5
  // at world 2, 2.0e-5 at world 3 on tok_embeddings.weight).
  const bool zero_gradient_params =
      spec.model == "gpt" || spec.model == "batchnorm" || spec.model == "llama-tiny";
  for (const std::string optimizer : {"sgd", "adam"}) {
    if (optimizer == "adam" && zero_gradient_params) continue;
    spec.optimizer = optimizer;
    const TrainResult oracle = train_single(spec, pg->world_size());
    for (bool view : {true, false}) {
      for (bool tiny : {true, false}) {
        parallel::DDPOptions options;
        options.gradients.gradient_as_bucket_view = view;
        if (tiny)
          options.gradients.buckets.first_bucket_cap_bytes =
              options.gradients.buckets.bucket_cap_bytes = buckets::mib_bytes(1e-6);
        const TrainResult got = train_ddp(spec, pg, options);
        std::ostringstream ctx;
        ctx << spec.model << " " << optimizer << " view=" << view << " tiny_caps=" << tiny
            << " rank " << pg->rank() << "/" << pg->world_size();
        require(got.names == oracle.names, ctx.str() + ": parameter names differ");
        require_close(got.names, got.params, oracle.params, 1e-5, ctx.str());
        if (spec.model == "batchnorm" && pg->rank() == 0) {
          // Running statistics: rank 0's, as the oracle's shard order reproduces.
          require_close(got.buffer_names, {got.buffers[0], got.buffers[1]},
                        {oracle.buffers[0], oracle.buffers[1]}, 1e-5, ctx.str() + " buffers");
        }
      }
    }
  }
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " at world size " << c.world; }

DDP_WORKER_CASE_TEST(Equivalence, ParametersMatchSingleProcessTraining, equivalence, Case);

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int world : {1, 2, 3}) {
    for (const auto& [model, dim] :
         std::vector<std::pair<std::string, int64_t>>{{"net", 48},
                                                      {"mlp", 0},
                                                      {"gpt", 32},
                                                      {"batchnorm", 0},
                                                      {"tied", 0},
                                                      {"llama-tiny", 32}}) {
      out.push_back({model, dim, world});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, Equivalence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name =
                               info.param.model + "_world" + std::to_string(info.param.world);
                           std::replace(name.begin(), name.end(), '-', '_');  // gtest: [A-Za-z0-9_]
                           return name;
                         });

}  // namespace
}  // namespace ddp::testing
