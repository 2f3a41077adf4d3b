// clip_grad_norm over layouts (optim/grad_clip.hpp, parallel/grad_clip.hpp): the total norm and
// the clipped gradients equal single-process clipping on the global batch (rel. err < 1e-6), for
// DDP, FULLY_SHARD and DEFAULT at worlds 1-3 (uneven shards at 3, a tied weight, a frozen
// parameter), for TP alone, DDP x TP and FULLY_SHARD x TP on 2x2 and 1x4 meshes, with the 2-norm
// and the inf-norm, clipping and not (a norm below max_norm changes nothing, bit for bit), with one
// collective per mesh dim that splits something (none for DDP). In one
// process: closed forms, the non-finite policies and the bad options by exact text.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/models/net.hpp"
#include "ddp/optim/grad_clip.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/tp/parallelize.hpp"
#include "support/error_text.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

// The single-process reference: PyTorch's clip_grad_norm_ on every distinct parameter's gradient.
double oracle_norm(torch::nn::Module& module, double norm_type) {
  std::vector<torch::Tensor> norms;
  std::set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.grad().defined()) continue;
    norms.push_back(std::isinf(norm_type) ? p.grad().abs().max() : p.grad().norm());
  }
  const auto all = torch::stack(norms);
  return std::isinf(norm_type) ? all.max().item<double>() : all.norm().item<double>();
}

void oracle_clip(torch::nn::Module& module, double total, double max_norm) {
  const double coef = max_norm / (total + 1e-6);
  if (coef >= 1) return;
  std::set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second && p.grad().defined()) p.grad().mul_(coef);
  }
}

// Our clipped gradients (each entry the real part this rank holds) against the oracle's,
// cut to this rank's part by `layout_of(name)`.
void require_same_grads(const optim::GradShards& ours, torch::nn::Module& oracle,
                        const std::function<layout::Layout(const std::string&)>& layout_of,
                        const std::vector<int64_t>& coordinate, const std::string& context) {
  require(!ours.entries.empty(), context + ": no gradients");
  for (const auto& e : ours.entries) {
    const torch::Tensor whole = oracle.named_parameters()[e.name].grad();
    const torch::Tensor want = comm::take_local(layout_of(e.name), whole, coordinate);
    require(want.sizes() == e.grad.sizes(), context + ": '" + e.name + "' has another shape");
    if (want.numel() == 0) continue;
    const double err = ((e.grad - want).norm() / want.norm()).item<double>();
    require(err < 1e-6,
            context + ": gradient of '" + e.name + "' differs by " + std::to_string(err));
  }
}

// ---- one process: closed forms, policies, errors ----

TEST(GradClip, TotalNormIsTheClosedFormAndClipsToMaxNorm) {
  torch::nn::Linear fc(2, 1);  // weight [1, 2], bias [1]
  fc->weight.mutable_grad() = torch::tensor({{3.0f, 4.0f}});
  fc->bias.mutable_grad() = torch::tensor({12.0f});
  const auto grads = optim::grad_shards(*fc);
  EXPECT_FLOAT_EQ(optim::total_grad_norm(grads, 2.0).item<float>(), 13.0f);
  EXPECT_FLOAT_EQ(optim::total_grad_norm(grads, kInf).item<float>(), 12.0f);
  optim::ClipOptions options;
  options.max_norm = 6.5;
  const auto result = optim::clip_grad_norm(grads, options);
  EXPECT_DOUBLE_EQ(result.norm(), 13.0);
  EXPECT_FALSE(result.skipped());
  const float coef = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_FLOAT_EQ(fc->weight.grad()[0][0].item<float>(), 3.0f * coef);
  EXPECT_FLOAT_EQ(fc->bias.grad()[0].item<float>(), 12.0f * coef);
  EXPECT_NEAR(optim::total_grad_norm(grads, 2.0).item<double>(), 6.5, 1e-5);
}

TEST(GradClip, ANormBelowMaxNormChangesNothing) {
  torch::nn::Linear fc(4, 3);
  fc->weight.mutable_grad() = torch::randn({3, 4});
  fc->bias.mutable_grad() = torch::randn({3});
  const auto before = fc->weight.grad().clone();
  optim::ClipOptions options;
  options.max_norm = 1e6;
  optim::clip_grad_norm(optim::grad_shards(*fc), options);
  EXPECT_TRUE(torch::equal(fc->weight.grad(), before));
}

TEST(GradClip, ATiedWeightCountsOnceAndAFrozenOneNotAtAll) {
  TiedNet net(6, 4);
  net->fc->bias.set_requires_grad(false);
  net->fc->bias.mutable_grad() = torch::full({4}, 100.0f);  // stale: must not count
  net->emb->weight.mutable_grad() = torch::full({6, 4}, 1.0f);
  net->fc->weight.mutable_grad() = torch::full({4, 4}, 2.0f);
  const auto grads = optim::grad_shards(*net);
  EXPECT_EQ(grads.entries.size(), 2u);
  EXPECT_FLOAT_EQ(optim::total_grad_norm(grads).item<float>(), std::sqrt(24.0f + 64.0f));
}

TEST(GradClip, ANonFiniteNormIsAnErrorNamingTheStepOrASkippedStep) {
  torch::nn::Linear fc(2, 1);
  fc->weight.mutable_grad() = torch::tensor({{1.0f, NAN}});
  fc->bias.mutable_grad() = torch::tensor({1.0f});
  const auto grads = optim::grad_shards(*fc);
  EXPECT_EQ(error_of([&] { optim::clip_grad_norm(grads, {}, 12); }),
            "ddp: clip_grad_norm: the total gradient norm is nan at step 12: a gradient holds nan "
            "or inf (lower the learning rate, or skip such steps with the non-finite policy "
            "'skip')");
  optim::ClipOptions skip;
  skip.non_finite = optim::NonFinite::kSkip;
  const auto result = optim::clip_grad_norm(grads, skip, 12);
  EXPECT_TRUE(result.skipped());
  EXPECT_TRUE(std::isnan(result.norm()));
  EXPECT_FLOAT_EQ(fc->bias.grad()[0].item<float>(), 1.0f);  // untouched
}

// The clipper keeps its results on the device: the flag of the step just clipped, the count of
// non-finite steps and the first one's step and norm, read only by check() and the accessors.
TEST(GradClip, TheClipperCountsOnTheDeviceAndNamesTheFirstBadStepWhenChecked) {
  torch::nn::Linear fc(2, 1);
  const auto set = [&](float second) {
    fc->weight.mutable_grad() = torch::tensor({{3.0f, second}});
    fc->bias.mutable_grad() = torch::tensor({0.0f});
  };
  optim::ClipOptions skip;
  skip.max_norm = 1.0;
  skip.non_finite = optim::NonFinite::kSkip;
  optim::GradClipper clipper(skip, torch::kCPU, /*first_step=*/10);
  set(4.0f);
  clipper.clip(optim::grad_shards(*fc));  // step 10
  EXPECT_FLOAT_EQ(clipper.skip_flag().item<float>(), 0.0f);
  EXPECT_DOUBLE_EQ(clipper.last_norm(), 5.0);
  set(INFINITY);
  clipper.clip(optim::grad_shards(*fc));  // step 11
  EXPECT_FLOAT_EQ(clipper.skip_flag().item<float>(), 1.0f);
  EXPECT_EQ(fc->weight.grad()[0][0].item<float>(), 3.0f);  // unscaled
  set(NAN);
  clipper.clip(optim::grad_shards(*fc));  // step 12
  set(4.0f);
  clipper.clip(optim::grad_shards(*fc));  // step 13
  EXPECT_FLOAT_EQ(clipper.skip_flag().item<float>(), 0.0f);
  EXPECT_EQ(clipper.skipped_steps(), 2);
  clipper.check();  // kSkip: logs, no throw
  optim::ClipOptions error = skip;
  error.non_finite = optim::NonFinite::kError;
  optim::GradClipper strict(error, torch::kCPU, /*first_step=*/1);
  set(4.0f);
  strict.clip(optim::grad_shards(*fc));
  strict.check();
  set(INFINITY);
  strict.clip(optim::grad_shards(*fc));
  EXPECT_EQ(error_of([&] { strict.check(); }),
            "ddp: clip_grad_norm: the total gradient norm is inf at step 2: a gradient holds nan "
            "or inf (lower the learning rate, or skip such steps with the non-finite policy "
            "'skip'); that step changed nothing");
}

TEST(GradClip, BadOptionsAreNamed) {
  optim::ClipOptions options;
  options.max_norm = 0;
  EXPECT_EQ(optim::clip_error(options),
            "--grad-clip must be a positive number (the largest total gradient norm), got 0");
  options.max_norm = -1;
  EXPECT_EQ(error_of([&] { optim::GradClipper clipper(options); }),
            "ddp: GradClipper: --grad-clip must be a positive number (the largest total gradient "
            "norm), got -1");
  options.max_norm = 1;
  options.norm_type = 1;
  EXPECT_EQ(optim::clip_error(options),
            "the gradient norm must be the 2-norm or the inf-norm, got norm type 1");
  EXPECT_EQ(error_of([] { optim::non_finite_from_name("zero"); }),
            "ddp: unknown non-finite gradient policy 'zero'; valid: error, skip");
}

// ---- every style: TiedNet(33, 16), fc.bias frozen ----
// 33 rows divide by 3, not 2; 16 rows by 2, not 3: DEFAULT mixes sharded and replicated at worlds
// 2 and 3, and FULLY_SHARD's shards are uneven (16 rows over 3 ranks: 6, 6, 4).

struct StyleCase {
  std::string style = "replicate";
  int world = 1;
  std::string norm = "2";  // "2" or "inf"
  double factor = 0.5;     // max_norm over the oracle's total norm
  DDP_CASE_FIELDS(style, norm, factor)
};

DDP_TEST_WORKER_WITH(clip_styles, StyleCase, c) {
  auto pg = worker_process_group();
  const auto style = shard::parse_style(c.style);
  const double norm_type = c.norm == "inf" ? kInf : 2.0;
  const double factor = c.factor;
  const int world = pg->world_size();
  torch::manual_seed(0);
  TiedNet net(33, 16);
  torch::manual_seed(0);
  TiedNet oracle(33, 16);
  net->fc->bias.set_requires_grad(false);
  oracle->fc->bias.set_requires_grad(false);
  auto model = data_parallel(net, pg, style);
  torch::manual_seed(1);
  const int64_t per_rank = 3;
  const auto idx = torch::randint(33, {per_rank * world});
  const auto target = torch::randint(33, {per_rank * world});
  const auto mine = [&](const torch::Tensor& t) {
    return t.narrow(0, per_rank * pg->rank(), per_rank);
  };
  torch::nn::functional::cross_entropy(model(mine(idx)), mine(target)).backward();
  torch::nn::functional::cross_entropy(oracle->forward(idx), target).backward();

  const double want = oracle_norm(*oracle, norm_type);
  optim::ClipOptions options;
  options.norm_type = norm_type;
  options.max_norm = factor * want;
  const auto before = parallel::grad_shards(model);
  std::vector<torch::Tensor> kept;
  for (const auto& e : before.entries) kept.push_back(e.grad.clone());
  const int64_t issued = pg->collectives_issued();
  const auto result = parallel::clip_grad_norm(model, options);
  const std::string context = std::string(shard::style_name(style)) + " at world " +
                              std::to_string(world) + ", norm " + c.norm + ", max_norm " +
                              std::to_string(factor) + " x the norm";
  // One collective where the style splits something over more than one rank, none for DDP.
  const bool sharded = model.style() != DataParallelStyle::kReplicate;
  const int64_t collectives = sharded && world > 1 ? 1 : 0;
  require(pg->collectives_issued() - issued == collectives,
          context + ": " + std::to_string(pg->collectives_issued() - issued) +
              " collectives, want " + std::to_string(collectives));
  require(
      rel(result.norm(), want) < 1e-6,
      context + ": total norm " + std::to_string(result.norm()) + " != " + std::to_string(want));
  oracle_clip(*oracle, want, options.max_norm);
  const auto layout_of = [&](const std::string& name) {
    return model.layouts().of(name, oracle->named_parameters()[name].sizes().vec());
  };
  const std::vector<int64_t> coordinate =
      sharded ? std::vector<int64_t>{pg->rank()} : std::vector<int64_t>{0};
  const auto after = parallel::grad_shards(model);
  require_same_grads(after, *oracle, layout_of, coordinate, context);
  if (factor > 1) {  // below max_norm: bit for bit as before
    for (size_t i = 0; i < kept.size(); ++i) {
      require(torch::equal(kept[i], after.entries[i].grad), context + ": a gradient changed");
    }
  }
}

void PrintTo(const StyleCase& c, std::ostream* out) {
  *out << c.style << " world " << c.world << " norm " << c.norm << " factor " << c.factor;
}

DDP_WORKER_CASE_TEST(GradClipStyles, EqualsSingleProcessClippingOnTheGlobalBatch, clip_styles,
                     StyleCase);

std::vector<StyleCase> style_cases() {
  std::vector<StyleCase> cases;
  for (const char* style : {"replicate", "fully_shard", "default"}) {
    for (int world : {1, 2, 3}) cases.push_back({style, world, "2", 0.5});
    cases.push_back({style, 3, "inf", 0.5});
    cases.push_back({style, 2, "2", 2.0});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Styles, GradClipStyles, ::testing::ValuesIn(style_cases()),
                         [](const auto& info) {
                           const StyleCase& c = info.param;
                           return c.style + "_world" + std::to_string(c.world) + "_" +
                                  (c.norm == "inf" ? "inf" : "l2") +
                                  (c.factor > 1 ? "_below" : "_clipped");
                         });

// ---- meshes: the seed Net(8), fc1 / fc3 colwise, fc2 / fc4 rowwise over "tp" ----

struct MeshCase {
  int dp = 1, tp = 2;
  std::string dp_style = "none";  // none, replicate, fully_shard
  std::string norm = "2";         // "2" or "inf"
  DDP_CASE_FIELDS(dp, tp, dp_style, norm)
};

DDP_TEST_WORKER_WITH(clip_meshes, MeshCase, m) {
  auto pg = worker_process_group();
  const int64_t dp = m.dp;
  const int64_t tps = m.tp;
  const std::string& dp_style = m.dp_style;
  const double norm_type = m.norm == "inf" ? kInf : 2.0;
  comm::DeviceMesh mesh(pg, {dp, tps}, {"dp", "tp"});
  const int64_t dp_rank = mesh.coordinate()[0];
  constexpr int64_t kDim = 8;
  torch::manual_seed(0);
  models::Net net(kDim);
  torch::manual_seed(0);
  models::Net oracle(kDim);
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"],
                                                {{"fc1", tp::ColwiseParallel()},
                                                 {"fc2", tp::RowwiseParallel()},
                                                 {"fc3", tp::ColwiseParallel()},
                                                 {"fc4", tp::RowwiseParallel()}});
  std::optional<DataParallel<models::Net>> model;
  if (dp_style != "none") {
    DataParallelOptions options;
    options.shard.units = {"fc1", "fc2", "fc3", "fc4"};
    model.emplace(net, mesh["dp"], shard::parse_style(dp_style), options);
  }
  torch::manual_seed(1);
  const int64_t per_dp = 3;
  const auto x = torch::randn({per_dp * dp, kDim});
  const auto y = torch::randn({per_dp * dp, kDim});
  const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, per_dp * dp_rank, per_dp); };
  const auto out = model ? (*model)(mine(x)) : net->forward(mine(x));
  torch::mse_loss(out, mine(y)).backward();
  torch::mse_loss(oracle->forward(x), y).backward();

  const double want = oracle_norm(*oracle, norm_type);
  optim::ClipOptions options;
  options.norm_type = norm_type;
  options.max_norm = 0.5 * want;
  // Issue 46: without the TensorParallel each tp rank normed only its shards, silently.
  const std::string refused =
      "ddp: clip_grad_norm: submodule 'fc1' is split by tensor parallelism; pass its "
      "TensorParallel: ddp::clip_grad_norm(model, *tp, max_norm) (without it each tp rank norms "
      "only its own shards)";
  if (model) {
    require(error_of([&] { parallel::clip_grad_norm(*model, options); }) == refused,
            "clip_grad_norm(model, options) over a TP-split model was not refused by name");
    require(error_of([&] { parallel::clip_grad_norm(*model, 1.0); }) == refused,
            "clip_grad_norm(model, max_norm) over a TP-split model was not refused by name");
  }
  const int64_t dp_issued = mesh["dp"]->collectives_issued();
  const int64_t tp_issued = mesh["tp"]->collectives_issued();
  // The public overloads with ClipOptions (the infinity norm too) over the mesh.
  const optim::ClipResult result = model
                                       ? parallel::clip_grad_norm(*model, *tensor_parallel, options)
                                       : parallel::clip_grad_norm(*net, *tensor_parallel, options);
  const std::string context = "mesh " + std::to_string(dp) + "x" + std::to_string(tps) + " " +
                              dp_style + " over dp, norm " + m.norm;
  // One collective per mesh dim that splits something over more than one rank.
  const int64_t dp_want = dp_style == "fully_shard" && dp > 1 ? 1 : 0;
  require(mesh["dp"]->collectives_issued() - dp_issued == dp_want &&
              mesh["tp"]->collectives_issued() - tp_issued == (tps > 1 ? 1 : 0),
          context + ": another number of collectives than one per splitting mesh dim");
  require(
      rel(result.norm(), want) < 1e-6,
      context + ": total norm " + std::to_string(result.norm()) + " != " + std::to_string(want));
  oracle_clip(*oracle, want, options.max_norm);
  const bool sharded = model && model->style() != DataParallelStyle::kReplicate;
  const auto layout_of = [&](const std::string& name) {
    return sharded ? model->layouts(*tensor_parallel)
                         .of(name, oracle->named_parameters()[name].sizes().vec())
                   : tensor_parallel->layout(name);
  };
  const std::vector<int64_t> coordinate =
      sharded ? mesh.coordinate() : std::vector<int64_t>{mesh.coordinate()[1]};
  const optim::GradShards grads =
      model ? parallel::grad_shards(*model, tensor_parallel.get())
            : parallel::grad_shards(*net, tensor_parallel->sharding(), true);
  require_same_grads(grads, *oracle, layout_of, coordinate, context);
}

void PrintTo(const MeshCase& m, std::ostream* out) {
  *out << "mesh " << m.dp << "x" << m.tp << ", " << m.dp_style << " over dp, norm " << m.norm;
}

class GradClipMeshes : public ::testing::TestWithParam<MeshCase> {};

TEST_P(GradClipMeshes, EqualsSingleProcessClippingOnTheGlobalBatch) {
  const MeshCase m = GetParam();
  EXPECT_WORKERS_PASS(run_workers(clip_meshes, m.dp * m.tp, m));
}

INSTANTIATE_TEST_SUITE_P(Meshes, GradClipMeshes,
                         ::testing::Values(MeshCase{1, 2, "none"}, MeshCase{1, 4, "none", "inf"},
                                           MeshCase{2, 2, "replicate"},
                                           MeshCase{2, 2, "replicate", "inf"},
                                           MeshCase{2, 2, "fully_shard"},
                                           MeshCase{2, 2, "fully_shard", "inf"},
                                           MeshCase{1, 2, "fully_shard"}),
                         [](const auto& info) {
                           const MeshCase& m = info.param;
                           return "dp" + std::to_string(m.dp) + "_tp" + std::to_string(m.tp) + "_" +
                                  m.dp_style + "_" + (m.norm == "inf" ? "inf" : "l2");
                         });

}  // namespace
}  // namespace ddp::testing
