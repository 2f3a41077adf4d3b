// Tensor parallelism (tp/parallelize.hpp) on Gloo: the seed test's case (DDP_TP_Test). A 2-D mesh
// ("dp", "tp"), the seed Net with fc1 / fc3 colwise and fc2 / fc4 rowwise over "tp", replicated
// over "dp" by DistributedDataParallel: the gradients of the first step and the parameters after
// K SGD steps, made whole over "tp", equal the single-process model on the global batch
// (rel. err < 1e-5). Meshes 2x2, 1x2, 2x1, 1x4, 4x1. Bad plans: a missing submodule, a tp size
// that does not divide the sharded dim, each named.

#include <gtest/gtest.h>

#include <torch/torch.h>
#include <functional>

#include <sstream>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/gpt.hpp"
#include "ddp/models/llama.hpp"
#include "ddp/models/net.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/tp/parallelize.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/oracle_twin.hpp"
#include "support/temp_dir.hpp"
#include "support/tiny_gpt.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kDim = 8;  // divides by 1, 2 and 4

tp::TpPlan seed_plan() {
  return {{"fc1", tp::ColwiseParallel()},
          {"fc2", tp::RowwiseParallel()},
          {"fc3", tp::ColwiseParallel()},
          {"fc4", tp::RowwiseParallel()}};
}

// A dp x tp mesh and the data-parallel wrapper over "dp" (read by tp_seed_net alone): "ddp"
// (DistributedDataParallel) or "fully_shard" (FULLY_SHARD, a unit per layer: each Linear is then a
// unit of both runtimes, [Note: nested unit listeners]).
struct Mesh {
  int dp = 1, tp = 2;
  std::string dp_style = "ddp";
  DDP_CASE_FIELDS(dp, tp, dp_style)
};

// One run over a dp x tp mesh.
DDP_TEST_WORKER_WITH(tp_seed_net, Mesh, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int64_t dp = c.dp;
  const int64_t tps = c.tp;
  const bool fully_shard = c.dp_style == "fully_shard";
  comm::DeviceMesh mesh(pg, {dp, tps}, {"dp", "tp"});
  const int64_t dp_rank = mesh.coordinate()[0];
  torch::manual_seed(pg->rank());  // rank 0's values must reach every rank
  models::Net net(kDim);
  torch::manual_seed(0);
  models::Net oracle(kDim);
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"], seed_plan());
  require(net->fc1->weight.size(0) == kDim / tps && net->fc2->weight.size(1) == kDim / tps,
          "the planned weights hold their shards");
  std::unique_ptr<parallel::DistributedDataParallel<models::Net>> ddp;
  std::unique_ptr<shard::FullyShardedDataParallel<models::Net>> sharded;
  if (fully_shard) {
    shard::ShardOptions options;
    options.units = {"fc1", "fc2", "fc3", "fc4"};
    sharded =
        std::make_unique<shard::FullyShardedDataParallel<models::Net>>(net, mesh["dp"], options);
  } else {
    ddp = std::make_unique<parallel::DistributedDataParallel<models::Net>>(net, mesh["dp"]);
  }
  const auto model = [&](const torch::Tensor& x) { return ddp ? (*ddp)(x) : (*sharded)(x); };
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(1);
  const int64_t per_dp = 3;
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({per_dp * dp, kDim});
    const auto y = torch::randn({per_dp * dp, kDim});
    const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, per_dp * dp_rank, per_dp); };
    torch::mse_loss(model(mine(x)), mine(y)).backward();
    torch::mse_loss(oracle->forward(x), y).backward();
    if (step == 0 && ddp) {  // (FULLY_SHARD's gradients are dp shards: its parameters are checked)
      std::vector<std::string> names;
      std::vector<torch::Tensor> ours, want;
      for (const auto& item : net->named_parameters()) {
        names.push_back(item.key());
        ours.push_back(tensor_parallel->full(item.key(), item.value().grad()));
        want.push_back(oracle->named_parameters()[item.key()].grad());
      }
      require_close(names, ours, want, 1e-5, "gradients of step 1");
    }
    opt.step();
    opt.zero_grad();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  // Whole over "dp" first (the wrapper's sharding: FULLY_SHARD's shards, DDP's whole), then over
  // "tp" tensor by tensor.
  const wrap::WrappedModel& wrapper =
      sharded ? static_cast<const wrap::WrappedModel&>(*sharded) : *ddp;
  auto whole = whole_parameters(*net, wrapper.sharding());
  for (auto& [name, t] : whole) t = tensor_parallel->full(name, t);
  // The same from the one layout description: TP's layout, with FULLY_SHARD's placement
  // appended (layout::nest), gathered in one collective over the mesh.
  for (const auto& [name, t] : whole) {
    const torch::Tensor param = net->named_parameters()[name];
    torch::Tensor again;
    if (sharded) {
      const auto both = layout::nest(tensor_parallel->layout(name), sharded->layout(name));
      const auto rows = layout::local_shape(both, mesh.coordinate());
      const torch::Tensor real = rows.empty() ? param : param.narrow(0, 0, rows[0]);
      again = comm::gather_whole(both, real, mesh, "whole " + name);
    } else {
      again =
          comm::gather_whole(tensor_parallel->layout(name), param, *mesh["tp"], "whole " + name);
    }
    require(torch::equal(again, t), "parameter '" + name + "' gathered by its layout differs");
  }
  // The export's one path (io::whole_state) by the wrapper's sharding nested on TP's, the same
  // call for both styles: its layouts with the mesh's parent group.
  const comm::Sharding sharding =
      parallel::over_tensor_parallel(wrapper.sharding(), *tensor_parallel, mesh.parent());
  require(sharding.groups == std::vector<comm::ProcessGroupPtr>{mesh["dp"], mesh["tp"]} &&
              sharding.layouts.mesh == mesh.shape() &&
              sharding.layouts.coordinate == mesh.coordinate(),
          "the nested sharding is over the mesh {dp, tp} with its groups");
  const io::TensorMap exported = io::whole_state(*net, sharding);
  for (const auto& [name, t] : whole) {
    require(torch::equal(exported.at(name), t), "exported '" + name + "' differs");
  }
  std::ostringstream context;
  context << "mesh " << dp << "x" << tps << " " << (fully_shard ? "fully_shard" : "ddp")
          << " over dp, parameters after 3 steps";
  require_close_by_name(whole, *oracle, 1e-5, context.str());
}

void PrintTo(const Mesh& m, std::ostream* out) {
  *out << "mesh " << m.dp << "x" << m.tp << ", " << m.dp_style << " over dp";
}

// Runs `worker` at dp x tp ranks with the mesh and dp's style as its Case.
void run_on_mesh(const Worker<Mesh>& worker, const Mesh& m) {
  EXPECT_WORKERS_PASS(run_workers(worker, m.dp * m.tp, m));
}

// "dp2_tp2", with "_fully_shard" where FULLY_SHARD runs over dp.
std::string mesh_name(const ::testing::TestParamInfo<Mesh>& info) {
  const Mesh& m = info.param;
  return "dp" + std::to_string(m.dp) + "_tp" + std::to_string(m.tp) +
         (m.dp_style == "ddp" ? "" : "_" + m.dp_style);
}

class TensorParallelSeedNet : public ::testing::TestWithParam<Mesh> {};

TEST_P(TensorParallelSeedNet, EqualsTheSingleProcessModelOnTheGlobalBatch) {
  run_on_mesh(tp_seed_net, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Meshes, TensorParallelSeedNet,
                         ::testing::Values(Mesh{2, 2}, Mesh{1, 2}, Mesh{2, 1}, Mesh{1, 4},
                                           Mesh{4, 1}, Mesh{2, 2, "fully_shard"},
                                           Mesh{1, 2, "fully_shard"}),
                         mesh_name);

// A zoo transformer's plan over "tp", DDP over "dp" (the mesh `m`): the same equality, gradients of
// step 1 and parameters after 3 steps. The GPT's (c_attn colwise by heads, projections rowwise, MLP
// colwise then rowwise) and the Llama's (wq, wk, wv colwise by heads, with 8 query heads sharing 2
// key/value heads; wo rowwise; w1, w3 colwise, w2 rowwise).
template <typename Holder, typename Config>
void train_tensor_parallel(const Mesh& m, const Config& config, const tp::TpPlan& plan,
                           int64_t vocab, int64_t seq_len, const std::string& what,
                           const std::function<int64_t(Holder&)>& first_split_rows,
                           int64_t whole_rows) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int64_t dp = m.dp;
  const int64_t tps = m.tp;
  comm::DeviceMesh mesh(pg, {dp, tps}, {"dp", "tp"});
  const int64_t dp_rank = mesh.coordinate()[0];
  // Every rank builds other weights: the plan and DDP make them the global rank 0's.
  torch::manual_seed(pg->rank());
  Holder model_tp(config);
  torch::manual_seed(0);
  Holder oracle(config);
  auto tensor_parallel = tp::parallelize_module(model_tp.ptr(), mesh["tp"], plan);
  require(first_split_rows(model_tp) == whole_rows / tps,
          what + ": the first colwise projection holds this rank's heads");
  parallel::DistributedDataParallel<Holder> model(model_tp, mesh["dp"]);
  torch::optim::SGD opt(model_tp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto loss = [](const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
  };
  const auto compare = [&](bool grads, const std::string& context) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ours, want;
    for (const auto& item : model_tp->named_parameters()) {
      const torch::Tensor mine = grads ? item.value().grad() : item.value();
      const torch::Tensor theirs =
          oracle->named_parameters()[item.key()];  // a copy: the dict is a temporary
      names.push_back(item.key());
      ours.push_back(tensor_parallel->full(item.key(), mine));
      want.push_back(grads ? theirs.grad() : theirs);
    }
    require_close(names, ours, want, 1e-5, context);
  };
  torch::manual_seed(1);
  const int64_t per_dp = 2;
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randint(vocab, {per_dp * dp, seq_len});
    const auto y = torch::randint(vocab, {per_dp * dp, seq_len});
    const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, per_dp * dp_rank, per_dp); };
    loss(model(mine(x)), mine(y)).backward();
    loss(oracle->forward(x), y).backward();
    if (step == 0) compare(true, what + " plan, gradients of step 1");
    opt.step();
    opt.zero_grad();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  compare(false, what + " plan, mesh " + std::to_string(dp) + "x" + std::to_string(tps) +
                     ", parameters after 3 steps");
}

DDP_TEST_WORKER_WITH(tp_gpt, Mesh, c) {
  const models::GPTConfig config = tiny_gpt(/*n_layers=*/2, /*n_heads=*/4, /*tied=*/false);
  train_tensor_parallel<models::GPT>(
      c, config, models::gpt_tensor_parallel_plan(config), config.vocab_size, config.seq_len, "GPT",
      [](models::GPT& m) {
        return m->h[0]->as<models::GPTBlockImpl>()->attn->c_attn->weight.size(0);
      },
      3 * config.d_model);
}

DDP_TEST_WORKER_WITH(tp_llama, Mesh, c) {
  models::LlamaConfig config;  // 8 query heads of 8, 2 key/value heads: 4 query heads each
  config.vocab_size = 37;
  config.seq_len = 8;
  config.d_model = 64;
  config.n_layers = 2;
  config.ffn_hidden = 96;
  train_tensor_parallel<models::Llama>(
      c, config, models::llama_tensor_parallel_plan(config), config.vocab_size, config.seq_len,
      "Llama",
      [](models::Llama& m) {
        return m->layers[0]->as<models::LlamaBlockImpl>()->attention->wk->weight.size(0);
      },
      config.n_kv_heads * (config.d_model / config.n_heads));
}

class TensorParallelGpt : public ::testing::TestWithParam<Mesh> {};

TEST_P(TensorParallelGpt, EqualsTheSingleProcessModelOnTheGlobalBatch) {
  run_on_mesh(tp_gpt, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Meshes, TensorParallelGpt, ::testing::Values(Mesh{1, 2}, Mesh{2, 2}),
                         mesh_name);

class TensorParallelLlama : public ::testing::TestWithParam<Mesh> {};

TEST_P(TensorParallelLlama, EqualsTheSingleProcessModelOnTheGlobalBatch) {
  run_on_mesh(tp_llama, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Meshes, TensorParallelLlama, ::testing::Values(Mesh{1, 2}, Mesh{2, 2}),
                         mesh_name);

// A vocabulary-parallel Embedding (RowwiseParallel on an Embedding) feeding a colwise then a
// rowwise Linear, at tp 2 and 4 with DDP over dp: equal to the single-process model.
struct EmbedNetImpl : torch::nn::Module {
  EmbedNetImpl() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    up = register_module("up", torch::nn::Linear(kDim, 2 * kDim));
    down = register_module("down", torch::nn::Linear(2 * kDim, kDim));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = unit::run_unit(
        *embed, [this](const torch::Tensor& in) { return embed->forward(in); }, ids);
    for (auto* fc : {&up, &down}) {
      x = unit::run_unit(
          **fc, [fc](const torch::Tensor& in) { return (*fc)->forward(in); }, x);
    }
    return x;
  }
  static constexpr int64_t kVocab = 12;  // divides by 2 and 4
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(EmbedNet);

DDP_TEST_WORKER_WITH(tp_embedding, Mesh, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int64_t dp = c.dp;
  const int64_t tps = c.tp;
  comm::DeviceMesh mesh(pg, {dp, tps}, {"dp", "tp"});
  const int64_t dp_rank = mesh.coordinate()[0];
  torch::manual_seed(pg->rank());
  EmbedNet net;
  torch::manual_seed(0);
  EmbedNet oracle;
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"],
                                                {{"embed", tp::RowwiseParallel()},
                                                 {"up", tp::ColwiseParallel()},
                                                 {"down", tp::RowwiseParallel()}});
  require(net->embed->weight.size(0) == EmbedNetImpl::kVocab / tps, "embed holds its vocab rows");
  parallel::DistributedDataParallel<EmbedNet> model(net, mesh["dp"]);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(1);
  const int64_t per_dp = 3;
  for (int step = 0; step < 3; ++step) {
    const auto ids = torch::randint(EmbedNetImpl::kVocab, {per_dp * dp, 5});
    const auto y = torch::randn({per_dp * dp, 5, kDim});
    const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, per_dp * dp_rank, per_dp); };
    torch::mse_loss(model(mine(ids)), mine(y)).backward();
    torch::mse_loss(oracle->forward(ids), y).backward();
    opt.step();
    opt.zero_grad();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  require_close_by_name(whole_parameters(*net, tensor_parallel->sharding()), *oracle, 1e-5,
                        "vocabulary-parallel embedding, parameters after 3 steps");
}

class TensorParallelEmbedding : public ::testing::TestWithParam<Mesh> {};

TEST_P(TensorParallelEmbedding, EqualsTheSingleProcessModelOnTheGlobalBatch) {
  run_on_mesh(tp_embedding, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Meshes, TensorParallelEmbedding, ::testing::Values(Mesh{2, 2}, Mesh{1, 4}),
                         mesh_name);

DDP_TEST_WORKER(tp_bad_plans) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const std::string missing = error_of([&] {
    models::Net net(kDim);
    tp::parallelize_module(net.ptr(), pg, {{"fc9", tp::ColwiseParallel()}});
  });
  require(missing ==
              "ddp: the tensor-parallel plan names 'fc9', which is not a submodule of the model "
              "(its Linear submodules: fc1, fc2, fc3, fc4)",
          "missing submodule: " + missing);
  const std::string uneven = error_of([&] {
    models::Net net(6);
    tp::parallelize_module(net.ptr(), pg, {{"fc2", tp::RowwiseParallel()}});
  });
  require(uneven == "ddp: RowwiseParallel on 'fc2': in_features 6 does not divide by the tp size 4",
          "uneven split: " + uneven);
}

TEST(TensorParallelPlan, AMissingSubmoduleOrAnUnevenSplitIsNamed) {
  EXPECT_WORKERS_PASS(run_workers(tp_bad_plans, 4));
}

// FULLY_SHARD over tensor parallelism, checkpointed with the dp group's sharding through the world
// group (a program using the public API): the error says which group and sharding to pass.
struct CheckpointCase {
  std::string dir;  // the checkpoint root
  DDP_CASE_FIELDS(dir)
};

DDP_TEST_WORKER_WITH(tp_sharded_checkpoint_group, CheckpointCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  comm::DeviceMesh mesh(pg, {2, 2}, {"dp", "tp"});
  models::Net net(kDim);
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"], seed_plan());
  shard::ShardOptions options;
  options.units = {"fc1", "fc2", "fc3", "fc4"};
  shard::FullyShardedDataParallel<models::Net> sharded(net, mesh["dp"], options);
  io::TrainingState state;
  state.model = net.ptr().get();
  state.step = 1;
  state.sharding = sharded.sharding();  // the dp group's alone
  io::CoordinatorOptions where;
  where.root = c.dir;
  const std::string error = error_of([&] { io::save_and_barrier(*pg, where, state); });
  require(error.find("ddp: save_and_barrier: the sharding is over a mesh of 2 ranks but the "
                     "group has 4; pass the group the sharding is over (its mesh group: a sharded "
                     "runtime's own group; for a sharded style over tensor parallelism, the "
                     "nested sharding model.sharding(*tp, mesh.parent()) with the mesh's parent "
                     "group)") != std::string::npos,
          "the error names the group to pass, got: '" + error + "'");
}

TEST(TensorParallelPlan, ShardedOverTpCheckpointedThroughTheWorldGroupSaysWhatToDo) {
  TempDir dir;
  EXPECT_WORKERS_PASS(run_workers(tp_sharded_checkpoint_group, 4, CheckpointCase{dir.str()}));
}

}  // namespace
}  // namespace ddp::testing
