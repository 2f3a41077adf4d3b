// Deferred, sharded initialisation (shard/deferred_init.hpp). In one process: the rows a rank keeps
// are the rows of a single process's construction with the same seed (the zoo's Llama, whose
// normal re-initialisation runs after its blocks were dropped), a dropped parameter is a NaN
// placeholder, buffers are kept whole. At worlds 1, 2 and 3 on Gloo, for DDP, FULLY_SHARD and
// DEFAULT: the wrapped model's whole parameters and buffers equal the single-process model bit for
// bit, no rank held any sharded parameter whole after its piece was built, and one SGD step on the
// global batch equals the single-process step (rel. err < 1e-5). Bad input: ranks seeded apart,
// a model built for FULLY_SHARD wrapped with DDP or with DEFAULT, each refused naming the
// parameter. Local draws (InitDraws::kLocal): each rank's rows are its local_draw_seed draws
// (a user's model), the zoo's layers are built unfilled and every wrapped value of the zoo's
// Llama and GPT is closed-form, one SGD step equal to one process's from those values.

#include "ddp/shard/deferred_init.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "ddp/comm/flat_shards.hpp"
#include "ddp/intake/module_intake.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/normal_init.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// A user's own model, not the zoo's: built piece by piece with shard_now after each, a BatchNorm's
// buffers among them; dim 0 of 6, 6, 3, 3, 2, 2 (DEFAULT replicates some at worlds 2 and 3).
struct PiecewiseImpl : torch::nn::Module {
  PiecewiseImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 6));
    shard::shard_now(*fc1);
    norm = register_module("norm", torch::nn::BatchNorm1d(6));
    shard::shard_now(*norm);
    fc2 = register_module("fc2", torch::nn::Linear(6, 3));
    shard::shard_now(*fc2);
    fc3 = register_module("fc3", torch::nn::Linear(3, 2));
    shard::shard_now(*this);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(norm(fc1(x))))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Piecewise);

// The workload `name` ("piecewise": the model above) built with `seed`.
models::Workload build(const std::string& name, uint64_t seed) {
  if (name != "piecewise") {
    models::WorkloadOptions options;
    options.seed = seed;
    return models::make_workload(name, options);
  }
  torch::manual_seed(static_cast<int64_t>(seed));
  models::Workload w;
  Piecewise net;
  w.name = name;
  w.module = torch::nn::AnyModule(net);
  w.ptr = net.ptr();
  w.wrap_units = {"fc1", "fc2"};
  w.lr = 0.1;
  w.batch = [](int64_t offset, int64_t n) {  // sample i from seed 99 + i alone
    std::vector<torch::Tensor> xs, ys;
    for (int64_t i = offset; i < offset + n; ++i) {
      torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(99 + i));
      xs.push_back(torch::randn({1, 5}, gen));
      ys.push_back(torch::randn({1, 2}, gen));
    }
    return std::make_pair(torch::cat(xs), torch::cat(ys));
  };
  w.loss = [](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); };
  return w;
}

std::vector<std::pair<std::string, torch::Tensor>> named_values(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : m.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

TEST(DeferredInit, ARankKeepsTheRowsOfTheSingleProcessModelAndPlaceholdersElsewhere) {
  // llama-tiny: N(0, 0.02) over the whole model after every block was already dropped
  // (fill_full), tied embedding, RoPE buffers.
  const models::Workload oracle = build("llama-tiny", 5);
  for (int rank : {0, 2}) {
    models::Workload w;
    {
      shard::DeferredInit deferred(3, rank, {shard::DataParallelStyle::kFullyShard, at::kCPU});
      w = build("llama-tiny", 5);
    }
    const auto whole = named_values(*oracle.ptr);
    const auto mine = named_values(*w.ptr);
    ASSERT_EQ(whole.size(), mine.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      const auto& [name, value] = mine[i];
      ASSERT_EQ(name, whole[i].first);
      ASSERT_EQ(value.sizes(), whole[i].second.sizes()) << name;
      const std::optional<shard::KeptRows> kept = shard::kept_rows(value);
      if (!kept) {  // a buffer: kept whole
        EXPECT_TRUE(torch::equal(value, whole[i].second)) << name;
        continue;
      }
      EXPECT_EQ(static_cast<int64_t>(value.storage().nbytes()), value.element_size())
          << name << ": one element";
      EXPECT_TRUE(value.isnan().all().item<bool>()) << name << ": a NaN placeholder";
      const comm::FlatShards split{value.size(0), 3};
      EXPECT_TRUE(torch::equal(kept->rows,
                               whole[i].second.narrow(0, split.offset(rank), split.length(rank))))
          << name << " rank " << rank;
      const torch::Tensor flat = whole[i].second.reshape({-1});
      const torch::Tensor values =
          flat.slice(0, 0, flat.numel(), std::max<int64_t>(1, flat.numel() / 65536))
              .to(torch::kDouble);
      EXPECT_TRUE(torch::allclose(kept->checksum,
                                  torch::stack({values.sum(), values.square().sum()}), 1e-12))
          << name;
    }
  }
}

TEST(DeferredInit, AForwardBeforeTheWrapGivesNaNNotPlausibleNumbers) {
  models::Workload w;
  {
    shard::DeferredInit deferred(2, 1, {shard::DataParallelStyle::kFullyShard, at::kCPU});
    w = build("piecewise", 3);
  }
  torch::NoGradGuard no_grad;
  w.ptr->eval();
  EXPECT_TRUE(w.module.forward(torch::randn({4, 5})).isnan().all().item<bool>());
}

TEST(DeferredInit, WithoutOneShardNowAndFillFullChangeNothing) {
  const models::Workload a = build("llama-tiny", 8);
  const models::Workload b = build("llama-tiny", 8);
  const auto x = named_values(*a.ptr), y = named_values(*b.ptr);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_FALSE(shard::is_deferred(x[i].second)) << x[i].first;
    EXPECT_TRUE(torch::equal(x[i].second, y[i].second)) << x[i].first;
  }
}

// A run at one world: the style and the workload ("piecewise": the model above, else the zoo's).
struct Case {
  std::string style, model;
  int world = 1;
  DDP_CASE_FIELDS(style, model)
};

// One plain-SGD step: this rank's part of the global batch through the wrap, the whole batch
// through the oracle. In eval mode: a BatchNorm normalizes by its running statistics, not by each
// rank's batch (issue 61).
void step_both(models::Workload& mine, parallel::DataParallel<torch::nn::AnyModule>& dp,
               models::Workload& oracle, int world, int rank) {
  mine.ptr->eval();
  oracle.ptr->eval();
  const int64_t per_rank = 2;
  auto opt = make_test_optimizer("plain-sgd", dp.module_ptr()->parameters(), mine.lr);
  auto oracle_opt = make_test_optimizer("plain-sgd", oracle.ptr->parameters(), oracle.lr);
  const auto [x, y] = mine.batch(rank * per_rank, per_rank);
  mine.loss(dp.forward(x), y).backward();
  opt->step();
  const auto [gx, gy] = oracle.batch(0, world * per_rank);
  oracle.loss(oracle.module.forward(gx), gy).backward();
  oracle_opt->step();
}

DDP_TEST_WORKER_WITH(deferred_init_matches_one_process, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto style = shard::parse_style(c.style);
  const std::string& model = c.model;
  const uint64_t seed = 11;
  models::Workload oracle = build(model, seed);
  models::Workload mine;
  {
    shard::DeferredInit deferred(*pg, {style, at::kCPU});
    mine = build(model, seed);
    // No sharded parameter is whole on this rank once its piece is built.
    for (const auto& p : intake::take_in(*mine.ptr).params) {
      if (!deferred.keeps_rows(p)) continue;
      require(
          shard::is_deferred(p) && static_cast<int64_t>(p.storage().nbytes()) == p.element_size(),
          "a parameter of shape " + std::to_string(p.numel()) + " elements is whole");
    }
  }
  parallel::DataParallelOptions options;
  options.shard.units = mine.wrap_units;
  parallel::DataParallel<torch::nn::AnyModule> dp(mine.module, pg, style, options);
  // The one export path, every style: parameters whole and buffers, on the CPU.
  const auto wrapped_values = [&] { return io::whole_state(*mine.ptr, dp.sharding()); };
  const auto oracle_values = [&] {
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, value] : named_values(*oracle.ptr)) out[name] = value;
    return out;
  };
  std::map<std::string, torch::Tensor> expected = oracle_values();
  for (const auto& [name, value] : wrapped_values()) {
    require(expected.count(name) == 1, "no oracle value for " + name);
    require(torch::equal(value, expected[name]), name + " differs from one process's value");
  }
  step_both(mine, dp, oracle, w, r);
  expected = oracle_values();
  for (const auto& [name, value] : wrapped_values()) {
    if (!value.is_floating_point()) {  // BatchNorm's num_batches_tracked
      require(torch::equal(value, expected[name]), name + " after one step differs");
      continue;
    }
    const double err = (value - expected[name]).norm().item<double>() /
                       std::max(expected[name].norm().item<double>(), 1e-30);
    require(err < 1e-5, name + " after one step: rel. error " + std::to_string(err));
  }
}

DDP_WORKER_CASE_TEST(DeferredInitWorlds,
                     TheWrappedModelIsTheSingleProcessModelBitForBitAndTrainsAsIt,
                     deferred_init_matches_one_process, Case);

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* style : {"replicate", "fully_shard", "default"}) {
    for (const char* model : {"llama-tiny", "gpt", "piecewise"}) {
      for (int world : {1, 2, 3}) out.push_back({style, model, world});
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name =
      info.param.style + "_" + info.param.model + "_" + std::to_string(info.param.world);
  for (char& ch : name) ch = std::isalnum(ch) ? ch : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(StylesModels, DeferredInitWorlds, ::testing::ValuesIn(cases()), case_name);

// A wrap that must be refused.
struct RefusedCase {
  std::string what;      // "seeds": ranks seeded apart; "style": wrapped with another style
  std::string style;     // the wrapper's style
  std::string expected;  // the refusal's whole message
  DDP_CASE_FIELDS(what, style, expected)
};

DDP_TEST_WORKER_WITH(deferred_init_refused, RefusedCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  models::Workload mine;
  {
    shard::DeferredInit deferred(*pg, {shard::DataParallelStyle::kFullyShard, at::kCPU});
    mine = build("piecewise", c.what == "seeds" ? 20 + pg->rank() : 20);
  }
  const std::string got = error_of([&] {
    parallel::DataParallel<torch::nn::AnyModule> dp(mine.module, pg, shard::parse_style(c.style));
  });
  require(got == c.expected, "refused with '" + got + "'");
}

void expect_refused(const std::string& what, const std::string& style,
                    const std::string& expected) {
  EXPECT_WORKERS_PASS(run_workers(deferred_init_refused, 2, RefusedCase{what, style, expected}));
}

TEST(DeferredInitRefuses, RanksSeededApartByNameAtTheWrap) {
  expect_refused("seeds", "fully_shard",
                 "ddp: ShardedModule: parameter 'fc1.weight' was initialised with other values "
                 "on 1 rank(s) than on rank 0 (deferred initialisation keeps each rank's rows, "
                 "so no broadcast can repair it): seed every rank alike before building the "
                 "model");
}

TEST(DeferredInitRefuses, AModelBuiltForFullyShardWrappedWithDdp) {
  expect_refused("style", "replicate",
                 "ddp: DistributedDataParallel: parameter 'fc1.weight' holds no values: deferred "
                 "initialisation kept only this rank's rows of it, for another style than this "
                 "wrapper's; wrap the model with the style it was built for");
}

TEST(DeferredInitRefuses, AModelBuiltForFullyShardWrappedWithDefault) {
  // At world 2, DEFAULT replicates fc2 (dim 0 of 3) that FULLY_SHARD split.
  expect_refused("style", "default",
                 "ddp: parameter 'fc2.weight' was built under deferred initialisation keeping "
                 "only this rank's rows, but style default replicates it (dim 0 of 3 over 2 "
                 "ranks); build it under the style it is wrapped with");
}

// [Note: local draws] at worlds 1-3 on Gloo, FULLY_SHARD and DEFAULT: each rank's kept rows are
// the fill of its rows' shape from local_draw_seed(seed, turn, rank) (DEFAULT's replicated
// parameters rank 0's, whole, on every rank); the generator is back where the construction left
// it; the wrap takes them (its checksum stand-in agrees) and one SGD step equals the oracle's from
// the wrapped model's whole values (rel. err < 1e-5).
struct LocalCase {
  std::string style;
  int world = 1;
  DDP_CASE_FIELDS(style)
};

DDP_TEST_WORKER_WITH(deferred_local_draws, LocalCase, c) {
  auto pg = worker_process_group();
  const int w = pg->world_size(), r = pg->rank();
  const uint64_t seed = 11;
  const shard::DataParallelStyle style = shard::parse_style(c.style);
  const auto fill = [](at::Tensor& t) { t.normal_(0.0, 0.02); };
  torch::manual_seed(5);
  Piecewise net{nullptr};
  std::vector<torch::Tensor> params;
  bool keeps_rows[16] = {};
  {
    shard::DeferredInit deferred(*pg, {style, at::kCPU, shard::InitDraws::kLocal, seed});
    net = Piecewise();
    params = net->parameters();
    require(params.size() <= 16, "at most 16 parameters");
    for (size_t i = 0; i < params.size(); ++i) {
      keeps_rows[i] = deferred.keeps_rows(params[i]);
      shard::fill_full(params[i], fill);  // turn i
    }
  }
  const torch::Tensor next = torch::randn({4});
  torch::manual_seed(5);
  Piecewise plain;
  require(torch::equal(next, torch::randn({4})),
          "the generator is where the construction left it after the local fills");
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    std::vector<int64_t> sizes = p.sizes().vec();
    at::Tensor got = p;
    int from = 0;  // the rank whose numbers a replicated parameter holds
    if (keeps_rows[i]) {
      const auto kept = shard::kept_rows(p);
      require(kept.has_value(), "parameter " + std::to_string(i) + " kept no rows");
      sizes[0] = comm::FlatShards{p.size(0), w}.length(r);
      got = kept->rows;
      from = r;
    }
    torch::manual_seed(static_cast<int64_t>(shard::local_draw_seed(seed, i, from)));
    at::Tensor expected = at::empty(sizes);
    fill(expected);
    require(torch::equal(got, expected),
            "parameter " + std::to_string(i) + ": not the local draw of turn " + std::to_string(i));
  }
  parallel::DataParallelOptions options;
  torch::nn::AnyModule module(net);
  parallel::DataParallel<torch::nn::AnyModule> dp(module, pg, style, options);
  std::map<std::string, torch::Tensor> start;
  for (const auto& [name, value] : io::whole_state(*net, dp.sharding())) start[name] = value;
  Piecewise oracle;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : oracle->named_parameters()) item.value().copy_(start.at(item.key()));
    for (auto& item : oracle->named_buffers()) item.value().copy_(start.at(item.key()));
  }
  net->eval();  // BatchNorm by its running statistics, as in the test above
  oracle->eval();
  auto opt = make_test_optimizer("plain-sgd", net->parameters());
  auto oracle_opt = make_test_optimizer("plain-sgd", oracle->parameters());
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({2 * w, 5}), y = torch::randn({2 * w, 2});
  torch::mse_loss(dp.forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)).backward();
  opt->step();
  torch::mse_loss(oracle->forward(x), y).backward();
  oracle_opt->step();
  NamedTensors after;
  for (const auto& [name, value] : io::whole_state(*net, dp.sharding())) {
    if (value.is_floating_point() && oracle->named_parameters().find(name) != nullptr) {
      after.emplace_back(name, value);
    }
  }
  require_close_by_name(after, *oracle, 1e-5, c.style + " with local draws, one SGD step");
}

DDP_WORKER_CASE_TEST(DeferredLocalDraws, EachRankDrawsItsRowsAndTrainsAsTheWrappedValues,
                     deferred_local_draws, LocalCase);

INSTANTIATE_TEST_SUITE_P(Styles, DeferredLocalDraws,
                         ::testing::Values(LocalCase{"fully_shard", 1}, LocalCase{"fully_shard", 2},
                                           LocalCase{"fully_shard", 3}, LocalCase{"default", 2},
                                           LocalCase{"default", 3}),
                         [](const ::testing::TestParamInfo<LocalCase>& info) {
                           return info.param.style + "_" + std::to_string(info.param.world);
                         });

// [Note: constructors' draws] The zoo's layers under local draws: built unfilled (one NaN, no
// memory to draw into), with their real options; built as libtorch builds them otherwise.
TEST(DeferredInit, UnderLocalDrawsAZooLayerIsBuiltUnfilled) {
  EXPECT_FALSE(shard::draws_locally());
  {
    shard::DeferredInit exact(2, 0, {shard::DataParallelStyle::kFullyShard, at::kCPU});
    EXPECT_FALSE(shard::draws_locally());
    const auto linear = models::normal_linear(3, 4);
    EXPECT_EQ(linear->weight.storage().nbytes(), 12 * sizeof(float));
    EXPECT_FALSE(linear->weight.isnan().any().item<bool>());
  }
  shard::DeferredInit local(
      2, 0, {shard::DataParallelStyle::kFullyShard, at::kCPU, shard::InitDraws::kLocal, 11});
  EXPECT_TRUE(shard::draws_locally());
  auto linear = models::normal_linear(3, 4);
  const auto embedding = models::normal_embedding(5, 6);
  EXPECT_EQ(linear->options.in_features(), 3);
  EXPECT_EQ(linear->options.out_features(), 4);
  EXPECT_EQ(embedding->options.num_embeddings(), 5);
  EXPECT_EQ(embedding->options.embedding_dim(), 6);
  const std::vector<std::pair<torch::Tensor, std::vector<int64_t>>> values = {
      {linear->weight, {4, 3}}, {linear->bias, {4}}, {embedding->weight, {5, 6}}};
  for (const auto& [value, sizes] : values) {
    EXPECT_EQ(value.sizes().vec(), sizes);
    EXPECT_EQ(static_cast<int64_t>(value.storage().nbytes()), value.element_size());
    EXPECT_TRUE(value.isnan().all().item<bool>());
    EXPECT_TRUE(value.requires_grad());
  }
  // shard_now leaves it unfilled (no rows kept yet); a forward gives NaN, never plausible numbers;
  // fill_full keeps this rank's rows (rows 0-1 of 4 at rank 0 of 2).
  shard::shard_now(*linear);
  EXPECT_FALSE(shard::is_deferred(linear->weight));
  EXPECT_EQ(static_cast<int64_t>(linear->weight.storage().nbytes()), linear->weight.element_size());
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(linear->forward(torch::ones({2, 3})).isnan().all().item<bool>());
  }
  shard::fill_full(linear->weight, [](at::Tensor& t) { t.fill_(0.5); });
  const auto kept = shard::kept_rows(linear->weight);
  ASSERT_TRUE(kept.has_value());
  EXPECT_TRUE(torch::equal(kept->rows, torch::full({2, 3}, 0.5)));
}

// The zoo's models under local draws at worlds 1-3 (their constructors' draws skipped): every
// value the wrap holds is closed-form, normal_init's turn by turn (a weight: each rank's rows
// drawn from local_draw_seed(seed, turn, rank), or rank 0's whole where the style replicates it;
// a bias: zeros; norms and buffers: as constructed); one SGD step equals the single-process step
// from those values (rel. err < 1e-5).
DDP_TEST_WORKER_WITH(deferred_zoo_local_draws, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto style = shard::parse_style(c.style);
  const uint64_t seed = 11;
  models::Workload plain = build(c.model, 5);
  models::Workload mine;
  std::map<std::string, bool> keeps_rows;
  {
    shard::DeferredInit deferred(*pg, {style, at::kCPU, shard::InitDraws::kLocal, seed});
    mine = build(c.model, 5);
    for (const auto& item : mine.ptr->named_parameters()) {
      keeps_rows[item.key()] = deferred.keeps_rows(item.value());
    }
  }
  // normal_init's draws, in its order (models/normal_init.hpp).
  const auto draw = [&](const torch::Tensor& like, uint64_t turn, bool rows) {
    std::vector<torch::Tensor> parts;
    for (int from = 0; from < (rows ? w : 1); ++from) {
      std::vector<int64_t> sizes = like.sizes().vec();
      if (rows) sizes[0] = comm::FlatShards{like.size(0), w}.length(from);
      torch::manual_seed(static_cast<int64_t>(shard::local_draw_seed(seed, turn, from)));
      parts.push_back(torch::empty(sizes).normal_(0.0, 0.02));
    }
    return torch::cat(parts);
  };
  std::map<std::string, torch::Tensor> expected;
  for (const auto& [name, value] : named_values(*plain.ptr)) expected[name] = value;
  std::set<std::string> drawn;
  uint64_t turn = 0;
  for (const auto& item : plain.ptr->named_modules("", /*include_self=*/false)) {
    const std::string prefix = item.key() + ".";
    const auto drawn_once = [&](const std::string& name, const torch::Tensor& value) {
      if (drawn.insert(name).second) expected[name] = draw(value, turn, keeps_rows.at(name));
      ++turn;
    };
    if (auto* linear = item.value()->as<torch::nn::Linear>()) {
      drawn_once(prefix + "weight", linear->weight);
      if (linear->bias.defined()) {
        expected[prefix + "bias"] = torch::zeros_like(linear->bias);
        ++turn;
      }
    } else if (auto* embedding = item.value()->as<torch::nn::Embedding>()) {
      drawn_once(prefix + "weight", embedding->weight);
    }
  }
  parallel::DataParallelOptions options;
  options.shard.units = mine.wrap_units;
  parallel::DataParallel<torch::nn::AnyModule> dp(mine.module, pg, style, options);
  const std::map<std::string, torch::Tensor> start = [&] {
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, value] : io::whole_state(*mine.ptr, dp.sharding())) out[name] = value;
    return out;
  }();
  for (const auto& [name, value] : start) {
    require(expected.count(name) == 1, "no closed-form value for " + name);
    require(torch::equal(value, expected.at(name)), name + " is not normal_init's local draw");
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& item : plain.ptr->named_parameters()) item.value().copy_(start.at(item.key()));
  }
  step_both(mine, dp, plain, w, r);
  NamedTensors after;
  for (const auto& [name, value] : io::whole_state(*mine.ptr, dp.sharding())) {
    if (plain.ptr->named_parameters().find(name) != nullptr) after.emplace_back(name, value);
  }
  require_close_by_name(after, *plain.ptr, 1e-5, c.style + " " + c.model + ", one SGD step");
}

DDP_WORKER_CASE_TEST(DeferredZooLocalDraws, EveryValueIsNormalInitsLocalDrawAndTrainsAsOne,
                     deferred_zoo_local_draws, Case);

INSTANTIATE_TEST_SUITE_P(
    StylesModels, DeferredZooLocalDraws,
    ::testing::Values(Case{"fully_shard", "llama-tiny", 1}, Case{"fully_shard", "llama-tiny", 2},
                      Case{"fully_shard", "llama-tiny", 3}, Case{"fully_shard", "gpt", 2},
                      Case{"fully_shard", "gpt", 3}, Case{"default", "llama-tiny", 3}),
    case_name);

}  // namespace
}  // namespace ddp::testing
