// The C ABI (include/ddp/c/ddp.h) used as a binding uses it: the model is built in C++, but only
// raw at::Tensor* pointers and names cross into libddp. At world 1, 2 and 3 on Gloo, training with
// the binding's own forward, backward and optimizer (two micro-batches under no_sync in one step)
// ends equal to the single-process oracle (rel. err < 1e-5); the clip gives the oracle's norm; a
// checkpoint saved through the ABI loads back bit for bit with its step; the stats list the
// buckets. Bad input (a NULL, freed or foreign handle, a different parameter count on one rank, a
// tensor on another device, calls out of order, a bad option) gets a status and the exact message,
// never a crash or a hang.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <string>
#include <vector>

#include "ddp/c/ddp.h"
#include "ddp/files/posix_file.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

void ok(ddp_status status, const char* what) {
  require(status == DDP_OK, std::string(what) + " failed: " + ddp_last_error());
}

// The status and the exact message; and the message names its function once ("f: f: ..." was a
// defect: the boundary and a check inside both added the name).
void refused(ddp_status status, ddp_status want, const std::string& message) {
  require(status == want, "status " + std::to_string(status) + ", expected " +
                              std::to_string(want) + " (" + ddp_last_error() + ")");
  const std::string got = ddp_last_error();
  require(message == got, "message '" + got + "', expected '" + message + "'");
  const std::string function = got.substr(0, got.find(':'));
  require(got.find(function, function.size()) == std::string::npos,
          "message '" + got + "' names " + function + " twice");
}

torch::nn::Sequential make_net() {
  return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(),
                               torch::nn::Linear(12, 5));
}

// What a binding holds: its tensors' addresses and names.
struct Handles {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<void*> pointers;
  std::vector<const char*> name_pointers;
  explicit Handles(torch::nn::Module& net) {
    for (const auto& item : net.named_parameters()) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      pointers.push_back(&params[i]);
      name_pointers.push_back(names[i].c_str());
    }
  }
};

double max_rel_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = b[i].abs().max().item<double>();
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / std::max(scale, 1e-12));
  }
  return worst;
}

// A training run: Gloo on the CPU (CI), or NCCL on CUDA (scripts/gpu-check.sh: CAbiGpu).
struct TrainingCase {
  std::string root;  // the checkpoint's directory
  std::string backend = "gloo";
  std::string device = "cpu";
  DDP_CASE_FIELDS(root, backend, device)
};

DDP_TEST_WORKER_WITH(c_abi_training, TrainingCase, c) {
  const std::string& backend = c.backend;
  const torch::Device device(c.device);
  ddp_group_options group_options;
  ddp_group_options_init(&group_options);
  group_options.backend = backend.c_str();
  ddp_group* group = nullptr;
  ok(ddp_group_create(&group_options, &group), "ddp_group_create from the environment");
  int rank = -1, world = 0;
  ok(ddp_group_rank(group, &rank), "ddp_group_rank");
  ok(ddp_group_world_size(group, &world), "ddp_group_world_size");
  torch::manual_seed(rank);  // rank 0's values are broadcast: seed 0, the oracle's
  auto net = make_net();
  net->to(device);
  Handles h(*net);
  ddp_options options;
  ddp_options_init(&options);
  options.first_bucket_cap_mb = options.bucket_cap_mb = 0.0002;  // a few buckets of this net
  ddp_model* model = nullptr;
  ok(ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), h.params.size(), &options,
                      &model),
     "ddp_model_create");
  torch::manual_seed(0);
  auto oracle = make_net();
  oracle->to(device);
  auto opt = make_test_optimizer("sgd", h.params);
  auto oracle_opt = make_test_optimizer("sgd", oracle->parameters());
  torch::manual_seed(1);
  const int64_t per_rank = 4;  // two micro-batches of 2 per step
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({world * per_rank, 6}).to(device);
    const auto y = torch::randn({world * per_rank, 5}).to(device);
    const auto mine = [&](const torch::Tensor& t, int micro) {
      return t.narrow(0, rank * per_rank + micro * 2, 2);
    };
    // Micro-batch 0 accumulates locally, micro-batch 1 synchronizes the sum.
    ok(ddp_model_no_sync_begin(model), "ddp_model_no_sync_begin");
    for (int micro = 0; micro < 2; ++micro) {
      if (micro == 1) ok(ddp_model_no_sync_end(model), "ddp_model_no_sync_end");
      ok(ddp_model_forward_begin(model), "ddp_model_forward_begin");
      torch::Tensor out = net->forward(mine(x, micro));
      void* outputs[] = {&out};
      ok(ddp_model_forward_end(model, outputs, 1), "ddp_model_forward_end");
      (torch::mse_loss(out, mine(y, micro)) / 2).backward();
    }
    double norm = 0;
    ok(ddp_model_clip_grad_norm(model, 0.5, &norm), "ddp_model_clip_grad_norm");
    opt->step();
    ok(ddp_model_zero_grad(model), "ddp_model_zero_grad");
    torch::mse_loss(oracle->forward(x), y).backward();
    const double want = torch::nn::utils::clip_grad_norm_(oracle->parameters(), 0.5);
    require(std::abs(norm - want) <= 1e-5 * want,
            "clip norm " + std::to_string(norm) + ", the oracle's " + std::to_string(want));
    oracle_opt->step();
    oracle_opt->zero_grad();
  }
  const double error = max_rel_error(h.params, oracle->parameters());
  require(error < 1e-5,
          "parameters differ from the oracle: max rel. error " + std::to_string(error));

  size_t needed = 0;
  ok(ddp_model_stats(model, nullptr, 0, &needed), "ddp_model_stats (length)");
  std::string stats(needed, '\0');
  ok(ddp_model_stats(model, stats.data(), stats.size(), nullptr), "ddp_model_stats");
  require(stats.find("3 iterations") != std::string::npos &&
              stats.find(" all-reduced (") != std::string::npos,
          "stats: " + stats);

  // Broadcast from the last rank: every rank ends with its value (closed form).
  torch::Tensor mine = torch::full({3}, static_cast<double>(rank)).to(device);
  void* broadcast[] = {&mine};
  ok(ddp_broadcast(group, broadcast, 1, world - 1), "ddp_broadcast");
  require(torch::equal(mine.cpu(), torch::full({3}, static_cast<double>(world - 1))),
          "broadcast from rank " + std::to_string(world - 1));

  // A checkpoint of the binding's tensors: saved at step 3, the tensors spoiled, loaded back.
  const std::string& root = c.root;
  ok(ddp_checkpoint_save(group, root.c_str(), h.pointers.data(), h.name_pointers.data(),
                         h.params.size(), 3),
     "ddp_checkpoint_save");
  std::vector<torch::Tensor> saved;
  for (const auto& p : h.params) saved.push_back(p.detach().clone());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : h.params) p.fill_(7);
  }
  int64_t step = 0;
  ok(ddp_checkpoint_load(group, root.c_str(), h.pointers.data(), h.name_pointers.data(),
                         h.params.size(), &step),
     "ddp_checkpoint_load");
  require(step == 3, "loaded step " + std::to_string(step));
  for (size_t i = 0; i < saved.size(); ++i) {
    require(torch::equal(saved[i], h.params[i]), h.names[i] + " did not load back bit for bit");
  }
  ok(ddp_model_free(model), "ddp_model_free");
  ok(ddp_group_free(group), "ddp_group_free");
  refused(ddp_group_rank(group, &rank), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_group_rank: the group was freed already (a ddp_group* comes from "
          "ddp_group_create)");
  refused(ddp_model_forward_begin(model), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_forward_begin: the model was freed already (a ddp_model* comes from "
          "ddp_model_create)");
}

DDP_TEST_WORKER(c_abi_bad_input) {
  ddp_group* group = nullptr;
  ok(ddp_group_create(nullptr, &group), "ddp_group_create");
  int rank = -1;
  ok(ddp_group_rank(group, &rank), "ddp_group_rank");
  auto net = make_net();
  Handles h(*net);
  ddp_model* model = nullptr;
  // Every rank: a tensor on another device than the group's (refused before any collective).
  torch::Tensor meta = torch::empty({3}, torch::TensorOptions().device(torch::kMeta));
  void* on_meta[] = {&meta};
  const char* meta_name[] = {"w"};
  refused(ddp_model_create(group, on_meta, meta_name, 1, nullptr, &model),
          DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_create: tensor 0 ('w') is on meta, but a gloo group reduces CPU tensors");
  ddp_options options;
  ddp_options_init(&options);
  options.comm_hook = "powersgd";
  refused(ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), h.params.size(),
                           &options, &model),
          DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_create: comm_hook 'powersgd' is not one of none (or allreduce), fp16, bf16");
  const char* dotted[] = {"fc..weight"};
  refused(ddp_model_create(group, h.pointers.data(), dotted, 1, nullptr, &model), DDP_ERROR_RUNTIME,
          "ddp_model_create: the name 'fc..weight' is not a qualified parameter name "
          "(dot-separated, no empty part)");
  // Rank 1 passes one parameter fewer: the replica check refuses on every rank, within the
  // collective timeout.
  const size_t count = h.params.size() - (rank == 1 ? 1 : 0);
  refused(
      ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), count, nullptr, &model),
      DDP_ERROR_RUNTIME,
      "ddp_model_create: ddp: model replicas differ across ranks: rank 0 has 4 parameters and "
      "buffers, rank 1 has 3; the first one only rank 0 has is parameter '2.bias' shape [5] "
      "dtype Float. Every rank must construct the same model.");
  // The comm hook option reaches the runtime (its stats name it).
  options.comm_hook = "fp16";
  ok(ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), h.params.size(), &options,
                      &model),
     "ddp_model_create with the fp16 hook");
  char stats[512];
  ok(ddp_model_stats(model, stats, sizeof stats, nullptr), "ddp_model_stats");
  require(std::string(stats).find(", hook fp16_compress, ") != std::string::npos,
          std::string("stats: ") + stats);
  ok(ddp_model_free(model), "ddp_model_free");
  // Calls out of order, on a good model.
  ok(ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), h.params.size(), nullptr,
                      &model),
     "ddp_model_create");
  refused(ddp_model_forward_end(model, nullptr, 0), DDP_ERROR_INVALID_STATE,
          "ddp_model_forward_end: no ddp_model_forward_begin before it");
  refused(ddp_model_no_sync_end(model), DDP_ERROR_INVALID_STATE,
          "ddp_model_no_sync_end: no ddp_model_no_sync_begin before it");
  void* null_output[] = {nullptr};
  ok(ddp_model_forward_begin(model), "ddp_model_forward_begin");
  refused(ddp_model_forward_end(model, null_output, 0), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_forward_end: no outputs (count is 0): pass the forward's output tensors, "
          "from which the gradient-ready order is predicted and unused parameters are found");
  refused(ddp_model_forward_end(model, null_output, 1), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_forward_end: outputs[0] is NULL");
  // Outputs no trainable parameter reaches (a detached tensor): the backward would reduce
  // nothing. Refused (the forward begun above ends there); the model stays usable.
  torch::Tensor detached = net->forward(torch::randn({2, 6})).detach();
  void* detached_output[] = {&detached};
  refused(ddp_model_forward_end(model, detached_output, 1), DDP_ERROR_RUNTIME,
          "ddp_model_forward_end: none of the model's 4 trainable parameters is reachable from "
          "the 1 output(s) (a detached tensor, or one the model's parameters did not compute): "
          "the next backward would reduce no gradient. Pass the forward's outputs, or set "
          "find_unused_parameters for a forward that may use none");
  ok(ddp_model_forward_begin(model), "ddp_model_forward_begin after a refused forward_end");
  torch::Tensor out = net->forward(torch::randn({2, 6}));
  void* output[] = {&out};
  ok(ddp_model_forward_end(model, output, 1), "ddp_model_forward_end");
  out.sum().backward();
  ok(ddp_model_zero_grad(model), "ddp_model_zero_grad");
  refused(ddp_model_clip_grad_norm(model, 0, nullptr), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_clip_grad_norm: max_norm 0.000000 must be positive");
  // A handle of the other kind, as an FFI that declares both void* can pass it: refused by kind
  // in every function that takes a handle.
  auto* model_as_group = reinterpret_cast<ddp_group*>(model);
  auto* group_as_model = reinterpret_cast<ddp_model*>(group);
  const std::string not_a_group =
      ": the group is a model handle (ddp_model*), not a group (a ddp_group* comes from "
      "ddp_group_create)";
  const std::string not_a_model =
      ": the model is a group handle (ddp_group*), not a model (a ddp_model* comes from "
      "ddp_model_create)";
  const auto bad = DDP_ERROR_INVALID_ARGUMENT;
  int64_t no_step = 0;
  refused(ddp_group_rank(model_as_group, &rank), bad, "ddp_group_rank" + not_a_group);
  refused(ddp_group_world_size(model_as_group, &rank), bad, "ddp_group_world_size" + not_a_group);
  refused(ddp_broadcast(model_as_group, nullptr, 0, 0), bad, "ddp_broadcast" + not_a_group);
  refused(ddp_model_create(model_as_group, h.pointers.data(), h.name_pointers.data(),
                           h.params.size(), nullptr, &model),
          bad, "ddp_model_create" + not_a_group);
  refused(ddp_checkpoint_save(model_as_group, "ckpt", nullptr, nullptr, 0, 0), bad,
          "ddp_checkpoint_save" + not_a_group);
  refused(ddp_checkpoint_load(model_as_group, "ckpt", nullptr, nullptr, 0, &no_step), bad,
          "ddp_checkpoint_load" + not_a_group);
  refused(ddp_group_free(model_as_group), bad, "ddp_group_free" + not_a_group);
  refused(ddp_model_forward_begin(group_as_model), bad, "ddp_model_forward_begin" + not_a_model);
  refused(ddp_model_forward_end(group_as_model, output, 1), bad,
          "ddp_model_forward_end" + not_a_model);
  refused(ddp_model_no_sync_begin(group_as_model), bad, "ddp_model_no_sync_begin" + not_a_model);
  refused(ddp_model_no_sync_end(group_as_model), bad, "ddp_model_no_sync_end" + not_a_model);
  refused(ddp_model_zero_grad(group_as_model), bad, "ddp_model_zero_grad" + not_a_model);
  refused(ddp_model_clip_grad_norm(group_as_model, 1.0, nullptr), bad,
          "ddp_model_clip_grad_norm" + not_a_model);
  refused(ddp_model_stats(group_as_model, nullptr, 0, nullptr), bad,
          "ddp_model_stats" + not_a_model);
  refused(ddp_model_free(group_as_model), bad, "ddp_model_free" + not_a_model);
  refused(ddp_broadcast(group, nullptr, 0, 5), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_broadcast: root 5 is not a rank of a group of 2");
  ok(ddp_model_free(model), "ddp_model_free");
  refused(ddp_model_free(model), DDP_ERROR_INVALID_ARGUMENT,
          "ddp_model_free: the model was freed already (a ddp_model* comes from "
          "ddp_model_create)");
  // find_unused_parameters allows a forward that uses no parameter (each counts as unused).
  ddp_options_init(&options);
  options.find_unused_parameters = 1;
  ok(ddp_model_create(group, h.pointers.data(), h.name_pointers.data(), h.params.size(), &options,
                      &model),
     "ddp_model_create with find_unused_parameters");
  ok(ddp_model_forward_begin(model), "ddp_model_forward_begin");
  ok(ddp_model_forward_end(model, detached_output, 1),
     "ddp_model_forward_end of a detached output with find_unused_parameters");
  ok(ddp_model_free(model), "ddp_model_free");
  ok(ddp_group_free(group), "ddp_group_free");
}

class CAbiTest : public ::testing::TestWithParam<int> {};

TEST_P(CAbiTest, TrainsThroughRawTensorPointersLikeTheOracle) {
  const std::string root = ::testing::TempDir() + "c_abi_ckpt_" + std::to_string(GetParam()) + "_" +
                           std::to_string(::getpid());
  EXPECT_WORKERS_PASS(run_workers(c_abi_training, GetParam(), TrainingCase{root}));
  // Not std::filesystem::remove_all: the torch wheel's copy of it crashes (files/posix_file.hpp).
  EXPECT_EQ(ddp::files::remove_tree(root), 0) << root;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CAbiTest, ::testing::Values(1, 2, 3), world_name);

TEST(CAbiGpu, TrainsOnNcclAtWorldOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string root = ::testing::TempDir() + "c_abi_gpu_" + std::to_string(::getpid());
  EXPECT_WORKERS_PASS(run_workers(c_abi_training, 1, TrainingCase{root, "nccl", "cuda"}));
  // Not std::filesystem::remove_all: the torch wheel's copy of it crashes (files/posix_file.hpp).
  EXPECT_EQ(ddp::files::remove_tree(root), 0) << root;
}

TEST(CAbi, BadInputIsAStatusAndAMessageNeverACrash) {
  EXPECT_WORKERS_PASS(run_workers(c_abi_bad_input, 2));
}

}  // namespace
}  // namespace ddp::testing
