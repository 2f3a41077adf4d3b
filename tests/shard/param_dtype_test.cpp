// param_dtype (FSDP2's mixed-precision policy, gather side) at world 1, 2 and 3 on Gloo: the zoo
// MLP (a unit per layer, uneven last layer) and the tied GPT (a unit per block) compute in bf16
// with fp32 shards, fp32 gradient shards and fp32 optimizer state. The oracle runs the same
// arithmetic in one process: a bf16 copy of its fp32 master weights computes every rank's part of
// the global batch, the bf16 gradients are averaged in fp32 and SGD with momentum steps the
// master. After K steps (one of them over two micro-batches with no_sync) the parameters agree to
// rel. err < 1e-5. Bad input: a dtype Gloo cannot reduce, a replicated parameter under DEFAULT,
// an integer dtype, each refused naming it. On GPUs (scripts/gpu-check.sh, worlds 1 and 2 as the
// machine holds them) the MLP case runs on NCCL with NcclOptions::register_buffers and the
// zero-CTA policy: the units gather in place into memory NCCL registered, kept between steps, and
// the result is the same oracle's; on a GPU without CUDA multicast (no registered memory there)
// the registered case is the group's refusal, its exact text.

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>

#include "ddp/models/gpt.hpp"
#include "ddp/models/mlp.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/tiny_gpt.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// The oracle of a param_dtype run: fp32 `master` and its bf16 copy `low`, same parameter names.
template <typename Holder>
class LowPrecisionOracle {
 public:
  LowPrecisionOracle(Holder master, Holder low, int world)
      : master_(master), low_(low), world_(world) {
    low_->to(torch::kBFloat16);
  }

  // One synchronized step: micro-batch m of rank k is parts(k, m), a loss of the low copy's
  // output; the bf16 gradients of each rank accumulate in bf16 over its micro-batches (as a
  // no_sync step does), then the ranks' are averaged in fp32 into the master's .grad.
  template <typename Part>
  void step(int micro_batches, Part part, torch::optim::Optimizer& opt) {
    {
      torch::NoGradGuard no_grad;
      const auto master = master_->named_parameters();
      for (auto& item : low_->named_parameters()) item.value().copy_(master[item.key()]);
    }
    std::vector<torch::Tensor> sum;
    for (int k = 0; k < world_; ++k) {
      for (auto& p : low_->parameters()) p.mutable_grad() = torch::Tensor();
      for (int m = 0; m < micro_batches; ++m) part(*low_, k, m).backward();
      const auto params = master_->named_parameters();
      size_t i = 0;
      for (auto& item : low_->named_parameters()) {
        const auto g = item.value().grad().to(torch::kFloat);
        if (sum.size() <= i) {
          sum.push_back(g);
        } else {
          sum[i] += g;
        }
        ++i;
      }
    }
    size_t i = 0;
    for (auto& item : master_->named_parameters()) {
      // A tied parameter is listed twice; its gradient is the same tensor under both names.
      item.value().mutable_grad() = sum[i++] / world_;
    }
    opt.step();
    opt.zero_grad();
  }
  Holder& master() { return master_; }
  Holder& low() { return low_; }

 private:
  Holder master_, low_;
  int world_;
};

// Every parameter of the wrapped module is an fp32 shard with an fp32 .grad between steps.
void require_fp32_shards(const std::vector<torch::Tensor>& params, const std::string& what) {
  for (const auto& p : params) {
    require(p.scalar_type() == torch::kFloat, what + ": a parameter is " +
                                                  std::string(c10::toString(p.scalar_type())) +
                                                  " between steps");
    require(!p.grad().defined() || p.grad().scalar_type() == torch::kFloat,
            what + ": a gradient shard is not fp32");
  }
}

// Where the MLP case runs: Gloo on the CPU, or NCCL on the rank's GPU, its gather buffer
// registered with the communicator or not.
struct Case {
  std::string backend = "gloo";
  bool register_buffers = false;
  DDP_CASE_FIELDS(backend, register_buffers)
};

DDP_TEST_WORKER_WITH(param_dtype_mlp, Case, c) {
  comm::NcclOptions nccl;
  nccl.register_buffers = c.register_buffers;
  if (c.register_buffers) nccl.cta_policy = 2;  // zero-CTA: the copy-engine all-gathers
  comm::ProcessGroupPtr pg;
  const std::string refused =
      error_of([&] { pg = worker_process_group(std::chrono::seconds(60), c.backend, nccl); });
  if (c.register_buffers && !refused.empty()) {
    // A GPU without CUDA multicast (one H200 alone): NCCL has no registered memory to give, and
    // the group says so by name instead of failing at the wrap.
    const std::string device =
        c10::str(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice());
    require(
        refused ==
            "ddp: NcclOptions::register_buffers (--nccl-register-buffers): NCCL cannot allocate "
            "registered memory on " +
                device +
                " (ProcessGroupNCCL's allocator needs NCCL >= 2.19 and a GPU with CUDA "
                "multicast, as GPUs joined by NVSwitch have); run without it",
        "the refusal of registered buffers: " + refused);
    std::cout << "registered buffers refused on " << device << " (no CUDA multicast)\n";
    return;
  }
  require(refused.empty(), "the group is made: " + refused);
  require(pg->registers_buffers() == c.register_buffers, "the group registers buffers as asked");
  const torch::Device device = c.backend == "nccl" ? torch::Device(torch::kCUDA) : torch::kCPU;
  const int w = pg->world_size(), r = pg->rank();
  // out 5: uneven at world 2 and 3
  const models::MLPOptions shape{/*in=*/6, /*hidden=*/10, /*out=*/5, /*depth=*/3};
  shard::ShardOptions options;
  options.units = {"layers.0", "layers.1", "layers.2"};
  options.param_dtype = torch::kBFloat16;
  options.reduce_dtype = torch::kFloat;  // Gloo cannot reduce bf16
  torch::manual_seed(r);                 // the wrapper broadcasts rank 0's values
  models::MLP net(shape);
  net->to(device);
  torch::manual_seed(0);
  LowPrecisionOracle<models::MLP> oracle{models::MLP(shape), models::MLP(shape), w};
  oracle.master()->to(device);
  oracle.low()->to(device);
  shard::FullyShardedDataParallel<models::MLP> model(net, pg, options);
  auto opt = make_test_optimizer("sgd", net->parameters());
  auto oracle_opt = make_test_optimizer("sgd", oracle.master()->parameters());
  const auto loss = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out.to(torch::kFloat), y);
  };
  torch::manual_seed(1);
  for (int s = 0; s < 4; ++s) {
    const int micro = s == 2 ? 2 : 1;  // step 2: no_sync over the first micro-batch
    std::vector<torch::Tensor> xs, ys;
    for (int m = 0; m < micro; ++m) {
      xs.push_back(torch::randn({3 * w, shape.in}).to(device));
      ys.push_back(torch::randn({3 * w, shape.out}).to(device));
    }
    const auto mine = [&](const torch::Tensor& t, int k) { return t.narrow(0, 3 * k, 3); };
    for (int m = 0; m < micro; ++m) {
      if (m + 1 < micro) {
        auto guard = model.no_sync();
        loss(model(mine(xs[m], r)), mine(ys[m], r)).backward();
      } else {
        const auto out = model(mine(xs[m], r));
        require(out.scalar_type() == torch::kBFloat16, "the MLP computes in param_dtype");
        loss(out, mine(ys[m], r)).backward();
      }
    }
    opt->step();
    opt->zero_grad();
    require_fp32_shards(net->parameters(), "MLP");
    oracle.step(
        micro,
        [&](models::MLPImpl& low, int k, int m) {
          return loss(low.forward(mine(xs[m], k).to(torch::kBFloat16)), mine(ys[m], k));
        },
        *oracle_opt);
  }
  int64_t held = 0;
  for (const auto& p : net->parameters()) held += p.numel() * static_cast<int64_t>(sizeof(float));
  require(held == model.local_param_bytes(), "between steps the module holds its fp32 shards");
  require_close_by_name(whole_parameters(model), *oracle.master(), 1e-5,
                        "param_dtype bf16, per-layer FULLY_SHARD of the MLP");
}

DDP_TEST_WORKER(param_dtype_gpt) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const models::GPTConfig config = tiny_gpt(/*n_layers=*/3);
  shard::ShardOptions options;
  for (int64_t i = 0; i < config.n_layers; ++i) options.units.push_back("h." + std::to_string(i));
  options.param_dtype = torch::kBFloat16;
  options.reduce_dtype = torch::kFloat;
  torch::manual_seed(r);
  models::GPT gpt(config);
  torch::manual_seed(0);
  LowPrecisionOracle<models::GPT> oracle{models::GPT(config), models::GPT(config), w};
  shard::FullyShardedDataParallel<models::GPT> model(gpt, pg, options);
  require(distinct(gpt->parameters()).size() + 1 == gpt->parameters().size(),
          "wte and lm_head stay tied");
  auto opt = make_test_optimizer("sgd", distinct(gpt->parameters()));
  auto oracle_opt = make_test_optimizer("sgd", distinct(oracle.master()->parameters()));
  const auto loss = [](const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat).reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  };
  torch::manual_seed(1);
  for (int s = 0; s < 3; ++s) {
    const auto x = torch::randint(config.vocab_size, {2 * w, config.seq_len});
    const auto y = torch::randint(config.vocab_size, {2 * w, config.seq_len});
    const auto mine = [&](const torch::Tensor& t, int k) { return t.narrow(0, 2 * k, 2); };
    const auto logits = model(mine(x, r));
    require(logits.scalar_type() == torch::kBFloat16, "the GPT computes in param_dtype");
    loss(logits, mine(y, r)).backward();
    opt->step();
    opt->zero_grad();
    require_fp32_shards(gpt->parameters(), "GPT");
    oracle.step(
        1,
        [&](models::GPTImpl& low, int k, int) { return loss(low.forward(mine(x, k)), mine(y, k)); },
        *oracle_opt);
  }
  require_close_by_name(whole_parameters(model), *oracle.master(), 1e-5,
                        "param_dtype bf16, per-block FULLY_SHARD of the tied GPT");
}

DDP_TEST_WORKER(param_dtype_errors) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size();
  const models::MLPOptions shape{/*in=*/6, /*hidden=*/10, /*out=*/5, /*depth=*/3};
  shard::ShardOptions options;
  options.param_dtype = torch::kBFloat16;  // reduce_dtype defaults to it: Gloo cannot reduce it
  const std::string gloo = error_of([&] {
    shard::FullyShardedDataParallel<models::MLP> refused(models::MLP(shape), pg, options);
  });
  require(gloo.rfind("ddp: reduce_dtype BFloat16 (param_dtype's, the default; set reduce_dtype "
                     "to reduce in another): the gloo backend cannot reduce it (",
                     0) == 0,
          "param_dtype bf16 on Gloo: " + gloo);
  options.reduce_dtype = torch::kFloat;
  options.style = shard::DataParallelStyle::kDefault;
  // The first parameter whose dim 0 does not divide: layers.0.weight's 10 rows at world 3,
  // layers.2.weight's 5 at world 2.
  const std::string name = w == 3 ? "layers.0.weight" : "layers.2.weight";
  const std::string rows = w == 3 ? "10" : "5";
  const std::string replicated = error_of([&] {
    shard::FullyShardedDataParallel<models::MLP> refused(models::MLP(shape), pg, options);
  });
  require(replicated == "ddp: param_dtype BFloat16 with style default: parameter '" + name +
                            "' is replicated (dim 0 of " + rows + " does not divide by " +
                            std::to_string(w) +
                            " ranks) and would keep its dtype beside cast ones; use style "
                            "fully_shard",
          "param_dtype under DEFAULT: " + replicated);
  options.style = shard::DataParallelStyle::kFullyShard;
  options.param_dtype = torch::kLong;
  const std::string integer = error_of([&] {
    shard::FullyShardedDataParallel<models::MLP> refused(models::MLP(shape), pg, options);
  });
  require(integer == "ddp: param_dtype Long is not a floating-point type",
          "an integer param_dtype: " + integer);
}

// On NCCL with the GPUs at hand (up to 2), plain and with the gather buffer registered.
TEST(ParamDtypeGpu, MlpOnNcclWithAndWithoutRegisteredBuffersEqualsTheLowPrecisionOracle) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int worlds = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  for (int world = 1; world <= worlds; ++world) {
    for (const bool registered : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (registered ? ", registered" : ""));
      EXPECT_WORKERS_PASS(run_workers(param_dtype_mlp, world, Case{"nccl", registered},
                                      {{"NCCL_NVLS_ENABLE", "0"}}, std::chrono::seconds(240)));
    }
  }
}

DDP_WORLD_SUITE(ParamDtypeTest, 1, 2, 3);

DDP_WORKER_TEST_P(ParamDtypeTest, MlpComputesInBFloat16AndEqualsTheLowPrecisionOracle,
                  param_dtype_mlp);

DDP_WORKER_TEST_P(ParamDtypeTest, TiedGptComputesInBFloat16AndEqualsTheLowPrecisionOracle,
                  param_dtype_gpt);

DDP_WORKER_TEST_PER_WORLD(ParamDtypeErrorsTest, RefusedNamingTheDtypeOrTheParameter,
                          param_dtype_errors, 2, 3);

}  // namespace
}  // namespace ddp::testing
