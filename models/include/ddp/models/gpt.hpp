#pragma once
// A nanoGPT-style decoder-only transformer. Submodule names follow nanoGPT (and so GPT-2 /
// Hugging Face checkpoints): wte, wpe, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj}, ln_f, lm_head. Attention is libtorch's fused scaled_dot_product_attention on
// torch >= 2.0 and written out on 1.13 (causal_attention.hpp).

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "ddp/tp/parallelize.hpp"

namespace ddp::models {

struct GPTConfig {
  // 4096: large enough that the embedding and lm_head dominate one bucket, as in real GPTs.
  int64_t vocab_size = 4096;
  // 128: longest input; inputs may be shorter (positions are taken from wpe's first rows).
  int64_t seq_len = 128;
  // 256: small enough for CPU tests ("gpt-tiny"); GPT-2 small is 768.
  int64_t d_model = 256;
  // 4: head dim 64, as in GPT-2. Must divide d_model.
  int64_t n_heads = 4;
  // 4: enough blocks for per-block buckets/units; GPT-2 small is 12.
  int64_t n_layers = 4;
  // false: lm_head has its own weight. true: lm_head->weight is wte->weight, as in GPT-2
  // (--tie-weights; vocab_size x d_model fewer parameters). Off by default because a tied weight
  // appears twice in named_parameters() (libtorch does not deduplicate), which code that walks
  // parameters by name must be ready for.
  bool tie_weights = false;
  // 0: no dropout (the tests' and benchmarks' models are deterministic). Otherwise nanoGPT's
  // places, in training mode only: the embeddings' sum, and each block's attention and MLP output
  // before the residual add (--dropout).
  double dropout = 0;
};

// Multi-head causal self-attention: c_attn projects to q, k, v in one matmul, c_proj mixes heads.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config);

  // x: [B, T, d_model] -> [B, T, d_model].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  int64_t n_heads_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

// The block's feed-forward: c_fc (d -> 4d), GELU, c_proj (4d -> d).
class GPTMLPImpl : public torch::nn::Module {
 public:
  explicit GPTMLPImpl(const GPTConfig& config);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(GPTMLP);

// Pre-LN residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class GPTBlockImpl : public torch::nn::Module {
 public:
  explicit GPTBlockImpl(const GPTConfig& config);

  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  GPTMLP mlp{nullptr};
};
TORCH_MODULE(GPTBlock);

// Weights of Linear and Embedding layers are drawn from N(0, 0.02) and biases are zero (GPT-2's
// init), so construction after torch::manual_seed(s) is deterministic. With tie_weights,
// lm_head->weight is the same tensor as wte->weight and named_parameters() lists it under both
// names. clone() unties them: Cloneable copies each submodule's parameters separately.
class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& config = {});

  // idx: int64 [B, T] token ids with T <= seq_len -> logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& idx);

  const GPTConfig& config() const { return config_; }
  // false (default): activations kept. true: every block's are recomputed in backward
  // (unit::activation_checkpoint, --fsdp-checkpoint), less memory for about one more forward.
  bool checkpoint_units = false;

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  // GPTBlock modules; a ModuleList so that names are h.0..., h.1... and a block can be wrapped
  // on its own (per-block sharding units).
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(GPT);

// The GPT's tensor-parallel plan (Megatron's): in every block, attn.c_attn colwise by heads
// (packed q, k, v), attn.c_proj rowwise, mlp.c_fc colwise, mlp.c_proj rowwise; embeddings,
// LayerNorms and lm_head stay replicated. The tp size must divide n_heads.
tp::TpPlan gpt_tensor_parallel_plan(const GPTConfig& config);

}  // namespace ddp::models
