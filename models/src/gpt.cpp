#include "ddp/models/gpt.hpp"

#include <vector>

#include <c10/util/Exception.h>
#include <torch/utils.h>

#include "ddp/models/causal_attention.hpp"
#include "ddp/models/normal_init.hpp"
#include "ddp/models/replace_parameter.hpp"
#include "ddp/models/unit_linear.hpp"
#include "ddp/unit/call_unit.hpp"

namespace ddp::models {

// nanoGPT's dropout; p = 0 returns `x` itself: no kernel, no random numbers drawn, so the default
// model's steps are the same as before dropout existed (and capturable as they were).
namespace {
torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 && training ? torch::dropout(x, p, true) : x;
}
}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config)
    : n_heads_(config.n_heads), dropout_(config.dropout) {
  c_attn = register_module("c_attn", normal_linear(config.d_model, 3 * config.d_model));
  c_proj = register_module("c_proj", normal_linear(config.d_model, config.d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t head_dim = x.size(2) / n_heads_;

  // Under tensor parallelism c_attn's output holds this rank's heads only (colwise, packed 3):
  // the widths and the head count come from the tensors, not the config.
  const auto fused = unit_linear(c_attn, x);
  const int64_t width = fused.size(2) / 3;
  const int64_t heads = width / head_dim;
  auto qkv = fused.split(width, /*dim=*/2);
  auto to_heads = [&](const torch::Tensor& t) {
    return t.view({batch, seq, heads, head_dim}).transpose(1, 2);  // [B, H, T, hd]
  };
  const auto q = to_heads(qkv[0]);
  const auto k = to_heads(qkv[1]);
  const auto v = to_heads(qkv[2]);

  auto y = causal_attention(q, k, v);  // [B, H, T, hd]
  y = y.transpose(1, 2).contiguous().view({batch, seq, width});
  return maybe_dropout(unit_linear(c_proj, y), dropout_, is_training());
}

GPTMLPImpl::GPTMLPImpl(const GPTConfig& config) : dropout_(config.dropout) {
  c_fc = register_module("c_fc", normal_linear(config.d_model, 4 * config.d_model));
  c_proj = register_module("c_proj", normal_linear(4 * config.d_model, config.d_model));
}

torch::Tensor GPTMLPImpl::forward(const torch::Tensor& x) {
  const auto h = torch::gelu(unit_linear(c_fc, x));
  // Without dropout c_proj's output is only added to the residual stream: skipped in a recompute.
  if (dropout_ == 0) return output_unit_linear(c_proj, h);
  return maybe_dropout(unit_linear(c_proj, h), dropout_, is_training());
}

GPTBlockImpl::GPTBlockImpl(const GPTConfig& config) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(std::vector<int64_t>{config.d_model}));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(std::vector<int64_t>{config.d_model}));
  mlp = register_module("mlp", GPTMLP(config));
}

torch::Tensor GPTBlockImpl::forward(torch::Tensor x) {
  x = x + attn(ln_1(x));
  return x + mlp(ln_2(x));
}

GPTImpl::GPTImpl(const GPTConfig& config) : config_(config) {
  TORCH_CHECK(config.vocab_size > 0 && config.seq_len > 0 && config.d_model > 0 &&
                  config.n_heads > 0 && config.n_layers >= 0,
              "GPT: sizes must be positive, got vocab_size=", config.vocab_size,
              " seq_len=", config.seq_len, " d_model=", config.d_model, " n_heads=", config.n_heads,
              " n_layers=", config.n_layers);
  TORCH_CHECK(config.dropout >= 0 && config.dropout < 1, "GPT: dropout must be in [0, 1), got ",
              config.dropout);
  TORCH_CHECK(config.d_model % config.n_heads == 0, "GPT: d_model (", config.d_model,
              ") must be divisible by n_heads (", config.n_heads, ")");

  // shard_now after each piece: under deferred initialisation every rank keeps only its rows of
  // it (shard/deferred_init.hpp); otherwise a no-op.
  wte = register_module("wte", normal_embedding(config.vocab_size, config.d_model));
  shard::shard_now(*wte);
  wpe = register_module("wpe", normal_embedding(config.seq_len, config.d_model));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layers; ++i) {
    h->push_back(GPTBlock(config));
    shard::shard_now(*h[i]);
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(std::vector<int64_t>{config.d_model}));
  lm_head =
      register_module("lm_head", normal_linear(config.d_model, config.vocab_size, /*bias=*/false));
  shard::shard_now(*lm_head);

  normal_init(*this);  // the LayerNorms keep their ones and zeros

  if (config.tie_weights) {
    lm_head->weight = wte->weight;
    detail::replace_parameter(*lm_head, "weight", wte->weight);
  }
  shard::shard_now(*this);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "GPT: expected token ids of shape [B, T], got ", idx.sizes());
  const int64_t seq = idx.size(1);
  TORCH_CHECK(seq <= config_.seq_len, "GPT: input length ", seq, " exceeds seq_len ",
              config_.seq_len);
  const auto positions = torch::arange(seq, idx.options().dtype(torch::kLong));
  auto x = maybe_dropout(wte(idx) + wpe(positions), config_.dropout, is_training());  // [B, T, d]
  for (const auto& block : *h) x = unit::call_unit(*block->as<GPTBlockImpl>(), x, checkpoint_units);
  return unit_linear(lm_head, ln_f(x));
}

tp::TpPlan gpt_tensor_parallel_plan(const GPTConfig& config) {
  tp::TpPlan plan;
  for (int64_t i = 0; i < config.n_layers; ++i) {
    const std::string block = "h." + std::to_string(i) + ".";
    plan.emplace_back(block + "attn.c_attn", tp::ColwiseParallel(/*packed=*/3));
    plan.emplace_back(block + "attn.c_proj", tp::RowwiseParallel());
    plan.emplace_back(block + "mlp.c_fc", tp::ColwiseParallel());
    plan.emplace_back(block + "mlp.c_proj", tp::RowwiseParallel());
  }
  return plan;
}

}  // namespace ddp::models
