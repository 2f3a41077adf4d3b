#pragma once
// A Llama-3-class decoder (Meta's reference model and torchtitan's, by their parameter names):
// tok_embeddings, layers.<i>.{attention_norm, attention.{wq, wk, wv, wo}, ffn_norm,
// feed_forward.{w1, w2, w3}}, norm, output. RMSNorm, rotary position embeddings on adjacent pairs
// (Meta's convention, theta 500000), SwiGLU, grouped-query attention (n_kv_heads key/value heads,
// each shared by n_heads / n_kv_heads query heads) through the zoo's causal attention (fused on
// torch >= 2.0, written out on 1.13), no biases. The rotary tables are buffers of the root
// (rope_cos, rope_sin: [seq_len, head_dim / 2], fp32), handed to every block at each forward.

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "ddp/tp/parallelize.hpp"

namespace ddp::models {

struct LlamaConfig {
  // The defaults are "llama-tiny", the CPU tests' shape; registry.cpp's rows set Llama 3's.
  int64_t vocab_size = 4096;  // Llama 3: 128256
  int64_t seq_len = 128;      // the longest input and the rotary tables' length; Llama 3: 8192
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;         // head dim d_model / n_heads (32 here, 128 in Llama 3)
  int64_t n_kv_heads = 2;      // must divide n_heads; Llama 3: 8
  int64_t ffn_hidden = 768;    // SwiGLU's hidden width (w1, w3: d -> ffn, w2: ffn -> d)
  double rope_theta = 500000;  // Llama 3's rotary base
  double norm_eps = 1e-5;      // RMSNorm's epsilon, Llama 3's
  // false: output has its own weight. true: output.weight is tok_embeddings.weight (Llama 3.2 1B
  // and 3B); named_parameters() then lists it under both names, as the tied GPT does.
  bool tie_weights = false;
};

// x / sqrt(mean(x^2) + eps) * weight, normalised in fp32 and cast back to x's dtype before the
// weight, as Meta's RMSNorm does. weight: [dim], ones at construction.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotates each adjacent pair (x[2i], x[2i+1]) of the last dim of x: [B, T, H, hd] by the angle of
// position t and frequency i; cos, sin: [>= T, hd / 2]. In fp32, cast back to x's dtype.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

// The rotary tables for `seq_len` positions of head dim `head_dim`: angle(t, i) = t * theta^(-2i /
// head_dim), computed in float64 and stored as fp32 ({cos, sin}, each [seq_len, head_dim / 2]).
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t seq_len, int64_t head_dim,
                                                      double theta);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // x: [B, T, d_model] -> [B, T, d_model], with the tables the root handed over (set_rotary).
  torch::Tensor forward(const torch::Tensor& x);
  // The root's tables, set before each forward: a block's forward takes one tensor (call_unit),
  // and a checkpointed block's recompute reads them again in backward (they never change).
  void set_rotary(torch::Tensor cos, torch::Tensor sin);

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};

 private:
  int64_t head_dim_;
  torch::Tensor cos_, sin_;
};
TORCH_MODULE(LlamaAttention);

// SwiGLU: w2(silu(w1(x)) * w3(x)).
class LlamaFeedForwardImpl : public torch::nn::Module {
 public:
  explicit LlamaFeedForwardImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(LlamaFeedForward);

// h = x + attention(attention_norm(x)); h + feed_forward(ffn_norm(h)).
class LlamaBlockImpl : public torch::nn::Module {
 public:
  explicit LlamaBlockImpl(const LlamaConfig& config);
  torch::Tensor forward(torch::Tensor x);

  RMSNorm attention_norm{nullptr};
  LlamaAttention attention{nullptr};
  RMSNorm ffn_norm{nullptr};
  LlamaFeedForward feed_forward{nullptr};
};
TORCH_MODULE(LlamaBlock);

// Every Linear and Embedding weight ~ N(0, 0.02) in modules() order (after
// torch::manual_seed(s), deterministic; bench/reference/zoo.py's Llama draws the same), norms ones.
class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& config = {});
  // idx: int64 [B, T], T <= seq_len -> logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& idx);
  const LlamaConfig& config() const { return config_; }
  // As GPTImpl::checkpoint_units: every block's activations recomputed in backward.
  bool checkpoint_units = false;

  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear output{nullptr};
  torch::Tensor rope_cos, rope_sin;  // buffers, [seq_len, head_dim / 2]

 private:
  LlamaConfig config_;
};
TORCH_MODULE(Llama);

// Llama 3's shape around the given widths: vocabulary 128256, 8 key/value heads, context 8192
// (the registry's llama-1b, -3b and -8b rows).
LlamaConfig llama3_config(int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t ffn_hidden,
                          bool tied);

// The Llama's tensor-parallel plan (Megatron's, as torchtitan's): in every block attention.wq,
// wk and wv colwise by heads, attention.wo rowwise, feed_forward.w1 and w3 colwise, w2 rowwise;
// embeddings, norms and output stay replicated. The tp size must divide n_kv_heads (a rank holds
// whole key/value heads and the query heads that share them).
tp::TpPlan llama_tensor_parallel_plan(const LlamaConfig& config);

// Parameters of `config` (a tied weight once), and the model FLOPs of one token's forward and
// backward as torchtitan counts them: 6 N (N without the token embedding when it is untied: a
// lookup, no matmul) + 12 n_layers d_model seq_len (attention's two matmuls).
int64_t llama_parameter_count(const LlamaConfig& config);
double llama_flops_per_token(const LlamaConfig& config);

}  // namespace ddp::models
