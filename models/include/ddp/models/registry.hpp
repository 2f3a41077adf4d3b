#pragma once
// Named synthetic workloads: a model plus a deterministic, learnable data stream and its loss, so
// that tests, ddp-train and ddp-bench can say "--model gpt-tiny" and get the same thing. The nets
// shaped only for tests (buffers, unused or tied parameters, out-of-order use) are in
// tests/support/test_nets.hpp, built on the same tasks (tasks.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

#include "ddp/tp/parallelize.hpp"

namespace ddp::models {

struct Workload {
  std::string name;
  torch::nn::AnyModule module;             // forward(Tensor) -> Tensor
  std::shared_ptr<torch::nn::Module> ptr;  // same module, for parameters()/named_parameters()
  // Deterministic batch for (global sample offset, batch size): the same (offset, n) gives the
  // same samples on every rank and in every process, so a rank's shard is a slice of the global
  // batch. Sample i depends only on (seed, i), never on offset or n. Tensors are on the CPU.
  std::function<std::pair<torch::Tensor, torch::Tensor>(int64_t offset, int64_t n)> batch;
  // Mean over the batch, so the gradient of a global batch's loss is the average of the
  // gradients of equal-sized shards.
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)> loss;
  // A learning rate at which SGD with momentum 0.9 learns the task without diverging (wide linear
  // Nets need smaller steps: their summed-over-features loss grows with the width).
  double lr = 0.05;
  // The units of --fsdp-wrap: the blocks or layers whose forward the model runs through
  // unit::run_unit (Net: fc1..fc4; MLP: layers.N; GPT: h.N; ResNet: layer1..layer4).
  std::vector<std::string> wrap_units;
  // The tensor-parallel plan (--tp): Net's seed plan (fc1 / fc3 colwise, fc2 / fc4 rowwise), the
  // GPT's Megatron plan; empty for a model without one.
  tp::TpPlan tp_plan;
  // Turns activation checkpointing of every wrap unit on or off (--fsdp-checkpoint); empty for a
  // model that cannot.
  std::function<void(bool)> set_checkpointing;
  // Model FLOPs of one token's forward and backward, as nanoGPT's estimate_mfu counts them:
  // 6 N (N: the parameters but the position embedding) + 12 n_layers d_model seq_len for the
  // attention's two matmuls per layer. 0 for a model without tokens (no MFU is shown).
  double flops_per_token = 0;
  // The forward's saved activations for `batch` sequences of `seq` tokens with `element`-byte
  // activations (2 under bf16 autocast, 4 in fp32), with or without activation checkpointing per
  // block: Korthikanti et al.'s 34 s b h bytes a layer at 16 bits (fused attention), s b h
  // elements a layer when checkpointed plus one layer recomputed, and the logits (s b V, in the
  // element and in fp32 for the loss). An estimate for the memory plan
  // (parallel/memory_estimate.hpp); empty for a model without tokens.
  std::function<int64_t(int64_t batch, int64_t seq, bool checkpointing, int64_t element)>
      activation_bytes;
};

struct WorkloadOptions {
  // 0: the model's default width. Otherwise the width the name table below says it sets.
  int64_t dim = 0;
  // 1234: arbitrary but fixed, so two processes given no seed build the same model and data.
  // Seeds both the model init (torch::manual_seed) and the data stream.
  uint64_t seed = 1234;
  // false: the GPTs' lm_head has its own weight. true: it shares wte's, as GPT-2 does
  // (GPTConfig::tie_weights, --tie-weights). Only for tied_weights_workload_names(); any other
  // workload refuses it, since it has no token embedding to tie.
  bool tie_weights = false;
  // The GPTs' shape beyond `dim` (their d_model), as nanoGPT names it; 0 keeps the row's value:
  // --n-layer, --n-head, --seq-len. `dropout` (--dropout, default 0) is GPTConfig::dropout. Any
  // other workload refuses them (check_model_flags in the tools).
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t seq_len = 0;
  double dropout = 0;
  // false (default): resnet-small's BatchNorms keep per-rank statistics, as PyTorch's model before
  // convert_sync_batchnorm. true (--sync-bn): SyncBatchNorm over the wrapper's group. Any other
  // workload refuses it (it has no BatchNorm).
  bool sync_batch_norm = false;
};

// Names, model, what `dim` sets, task:
//   net            Net(2000), the seed test's       dim: width          regression
//   toy            Net(2000), the seed test's       dim: width          regression
//   toy8k          Net(8192)                        dim: width          regression
//   mlp            MLP{64, 64, 64, depth 4}         dim: every width    regression
//   mlp-deep       MLP{} (512 wide, depth 16)       dim: every width    regression
//   gpt            GPT{vocab 256, seq_len 32, d_model 64, 4 heads, 2 layers}
//                                                   dim: d_model        next token
//   gpt-tiny       GPT{} (GPTConfig defaults)       dim: d_model        next token
//   gpt2-small     GPT{vocab 50304, seq_len 1024, d_model 768, 12 heads, 12 layers}
//                                                   dim: d_model        next token
//   gpt2-medium    GPT{vocab 50304, seq_len 1024, d_model 1024, 16 heads, 24 layers}
//                                                   dim: d_model        next token
//   gpt-char       GPT{vocab 256, seq_len 256, d_model 384, 6 heads, 6 layers}
//                                                   dim: d_model        next token
//   llama-tiny     Llama{vocab 4096, seq_len 128, d_model 256, 4 layers, 8 / 2 heads, FFN 768}
//                                                   dim: d_model        next token
//   llama-1b       Llama 3.2 1B: {vocab 128256, seq_len 8192, d_model 2048, 16 layers, 32 / 8
//                  heads, FFN 8192, tied}           dim: d_model        next token
//   llama-3b       Llama 3.2 3B: {d_model 3072, 28 layers, 24 / 8 heads, FFN 8192, tied}
//                                                   dim: d_model        next token
//   llama-8b       Llama 3.1 8B: {d_model 4096, 32 layers, 32 / 8 heads, FFN 14336, untied}
//                                                   dim: d_model        next token
//   resnet-small   ResNetSmall(10, width 64)        dim: width          image class
// Regression: x ~ N(0, 1) per feature; target = a fixed random linear map of x of rank <= 16
// (singular values falling as 1/k), scaled so that E|target|^2 = 1; loss = squared error summed
// over features, mean over the batch. The untrained Net's own output adds about width/81 to the
// initial loss (PyTorch's default init shrinks variance 3x per layer, biases aside): ~4 for "net",
// ~26 for "toy", ~100 for "toy8k".
// Next token: each sequence counts up by one from a random start (mod vocab); targets are the
// inputs shifted by one; loss = cross entropy, mean over all tokens. Image class
// (resnet-small): x ~ N(0, 1) of shape [3, 32, 32]; target = argmax over 10 fixed random unit
// vectors of their dot product with the per-channel means of x; cross entropy, mean over the batch.
// Calls torch::manual_seed(options.seed), so it resets the global generator.
Workload make_workload(const std::string& name, const WorkloadOptions& options = {});

// The Workload::lr that make_workload(name, options) would give, without building the model (a
// GPT2-medium takes seconds): the tools check a learning-rate schedule against it before any
// worker starts. Throws for a name make_workload refuses.
double workload_lr(const std::string& name, const WorkloadOptions& options = {});

// The sequence length of a GPT or Llama workload (options.seq_len, else the row's), without
// building the model; 0 for a workload without tokens. Throws for a name make_workload refuses.
int64_t workload_seq_len(const std::string& name, const WorkloadOptions& options = {});

// The names make_workload accepts, in the order of the table above.
std::vector<std::string> workload_names();

// The workloads that accept WorkloadOptions::tie_weights (the GPTs), in the same order.
std::vector<std::string> tied_weights_workload_names();

// The workloads that accept WorkloadOptions::n_layers, n_heads and seq_len (the GPTs and the
// Llamas), in the same order.
std::vector<std::string> shaped_workload_names();

}  // namespace ddp::models
