#include "ddp/models/llama.hpp"

#include <cmath>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/utils.h>

#include "ddp/models/causal_attention.hpp"
#include "ddp/models/normal_init.hpp"
#include "ddp/models/replace_parameter.hpp"
#include "ddp/models/unit_linear.hpp"
#include "ddp/unit/call_unit.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::models {

namespace {

torch::nn::Linear no_bias(int64_t in, int64_t out) { return normal_linear(in, out, false); }

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const auto xf = x.to(torch::kFloat);
  const auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return normed.to(x.scalar_type()) * weight;
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t seq_len, int64_t head_dim,
                                                      double theta) {
  TORCH_CHECK(head_dim % 2 == 0, "Llama: the head dim (", head_dim,
              ") must be even for rotary "
              "embeddings");
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto i = torch::arange(head_dim / 2, opts);
  const auto inv_freq = torch::pow(theta, -2.0 * i / static_cast<double>(head_dim));
  const auto angles = torch::outer(torch::arange(seq_len, opts), inv_freq);  // [T, hd / 2]
  return {angles.cos().to(torch::kFloat), angles.sin().to(torch::kFloat)};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const int64_t seq = x.size(1), half = x.size(3) / 2;
  const auto pairs = x.to(torch::kFloat).unflatten(-1, {half, 2});  // [B, T, H, hd / 2, 2]
  const auto x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  const auto c = cos.narrow(0, 0, seq).view({1, seq, 1, half});
  const auto s = sin.narrow(0, 0, seq).view({1, seq, 1, half});
  return torch::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).flatten(-2).to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config)
    : head_dim_(config.d_model / config.n_heads) {
  wq = register_module("wq", no_bias(config.d_model, config.n_heads * head_dim_));
  wk = register_module("wk", no_bias(config.d_model, config.n_kv_heads * head_dim_));
  wv = register_module("wv", no_bias(config.d_model, config.n_kv_heads * head_dim_));
  wo = register_module("wo", no_bias(config.n_heads * head_dim_, config.d_model));
}

void LlamaAttentionImpl::set_rotary(torch::Tensor cos, torch::Tensor sin) {
  cos_ = std::move(cos);
  sin_ = std::move(sin);
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(cos_.defined(),
              "Llama: attention called without the rotary tables (call the "
              "Llama root, which hands them over)");
  const int64_t batch = x.size(0), seq = x.size(1);
  // The head counts come from the tensors (a tensor-parallel split holds some heads only).
  const auto heads = [&](const torch::Tensor& t) {
    TORCH_CHECK(t.size(2) % head_dim_ == 0, "Llama: a projection of ", t.size(2),
                " columns holds part of a head of ", head_dim_,
                "; under tensor parallelism the "
                "tp size must divide n_kv_heads");
    return t.view({batch, seq, t.size(2) / head_dim_, head_dim_});  // [B, T, H, hd]
  };
  const auto q = apply_rotary(heads(unit_linear(wq, x)), cos_, sin_).transpose(1, 2);
  auto k = apply_rotary(heads(unit_linear(wk, x)), cos_, sin_).transpose(1, 2);
  auto v = heads(unit_linear(wv, x)).transpose(1, 2);  // [B, H_kv, T, hd]
  // Grouped-query attention: each key/value head serves n_rep query heads in a row (Meta's
  // repeat_kv), expanded before the fused kernel, which 2.0-2.4 cannot share heads in.
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "Llama: this rank holds ", q.size(1), " query heads and ",
              k.size(1),
              " key/value heads; under tensor parallelism the tp "
              "size must divide n_kv_heads");
  const int64_t n_rep = q.size(1) / k.size(1);
  if (n_rep > 1) {
    const auto repeat = [&](const torch::Tensor& t) {
      return t.unsqueeze(2)
          .expand({batch, t.size(1), n_rep, seq, head_dim_})
          .reshape({batch, t.size(1) * n_rep, seq, head_dim_});
    };
    k = repeat(k);
    v = repeat(v);
  }
  const auto y = causal_attention(q, k, v).transpose(1, 2).contiguous().view({batch, seq, -1});
  return unit_linear(wo, y);
}

LlamaFeedForwardImpl::LlamaFeedForwardImpl(const LlamaConfig& config) {
  w1 = register_module("w1", no_bias(config.d_model, config.ffn_hidden));
  w2 = register_module("w2", no_bias(config.ffn_hidden, config.d_model));
  w3 = register_module("w3", no_bias(config.d_model, config.ffn_hidden));
}

torch::Tensor LlamaFeedForwardImpl::forward(const torch::Tensor& x) {
  // w2's output is only added to the residual stream: skipped in a recompute.
  return output_unit_linear(w2, torch::silu(unit_linear(w1, x)) * unit_linear(w3, x));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) {
  attention_norm = register_module("attention_norm", RMSNorm(config.d_model, config.norm_eps));
  attention = register_module("attention", LlamaAttention(config));
  ffn_norm = register_module("ffn_norm", RMSNorm(config.d_model, config.norm_eps));
  feed_forward = register_module("feed_forward", LlamaFeedForward(config));
}

torch::Tensor LlamaBlockImpl::forward(torch::Tensor x) {
  x = x + attention(attention_norm(x));
  return x + feed_forward(ffn_norm(x));
}

LlamaImpl::LlamaImpl(const LlamaConfig& config) : config_(config) {
  TORCH_CHECK(config.vocab_size > 0 && config.seq_len > 0 && config.d_model > 0 &&
                  config.n_heads > 0 && config.n_kv_heads > 0 && config.ffn_hidden > 0 &&
                  config.n_layers >= 0,
              "Llama: sizes must be positive, got vocab_size=", config.vocab_size,
              " seq_len=", config.seq_len, " d_model=", config.d_model, " n_heads=", config.n_heads,
              " n_kv_heads=", config.n_kv_heads, " ffn_hidden=", config.ffn_hidden,
              " n_layers=", config.n_layers);
  TORCH_CHECK(config.d_model % config.n_heads == 0, "Llama: d_model (", config.d_model,
              ") must be divisible by n_heads (", config.n_heads, ")");
  TORCH_CHECK(config.n_heads % config.n_kv_heads == 0, "Llama: n_heads (", config.n_heads,
              ") must be a multiple of n_kv_heads (", config.n_kv_heads, ")");
  // shard_now after each piece: under deferred initialisation every rank keeps only its rows of
  // it (shard/deferred_init.hpp); otherwise a no-op.
  tok_embeddings =
      register_module("tok_embeddings", normal_embedding(config.vocab_size, config.d_model));
  shard::shard_now(*tok_embeddings);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layers; ++i) {
    layers->push_back(LlamaBlock(config));
    shard::shard_now(*layers[i]);
  }
  norm = register_module("norm", RMSNorm(config.d_model, config.norm_eps));
  output = register_module("output", no_bias(config.d_model, config.vocab_size));
  shard::shard_now(*output);
  auto [cos, sin] =
      rotary_tables(config.seq_len, config.d_model / config.n_heads, config.rope_theta);
  rope_cos = register_buffer("rope_cos", cos);
  rope_sin = register_buffer("rope_sin", sin);
  normal_init(*this);  // the RMSNorms keep their ones
  if (config.tie_weights) {
    output->weight = tok_embeddings->weight;
    detail::replace_parameter(*output, "weight", tok_embeddings->weight);
  }
  shard::shard_now(*this);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "Llama: expected token ids of shape [B, T], got ", idx.sizes());
  TORCH_CHECK(idx.size(1) <= config_.seq_len, "Llama: input length ", idx.size(1),
              " exceeds seq_len ", config_.seq_len);
  // Through run_unit, so that an untied model's embedding can be a sharded unit of its own
  // (registry.cpp's wrap units) and tensor parallelism can split it; a plain call otherwise.
  auto x = unit::run_unit(
      *tok_embeddings, [this](const torch::Tensor& ids) { return tok_embeddings(ids); },
      idx);  // [B, T, d]
  for (const auto& block : *layers) {
    auto& impl = *block->as<LlamaBlockImpl>();
    impl.attention->set_rotary(rope_cos, rope_sin);
    x = unit::call_unit(impl, x, checkpoint_units);
  }
  return unit_linear(output, norm(x));
}

tp::TpPlan llama_tensor_parallel_plan(const LlamaConfig& config) {
  tp::TpPlan plan;
  for (int64_t i = 0; i < config.n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i) + ".";
    for (const char* name : {"attention.wq", "attention.wk", "attention.wv"}) {
      plan.emplace_back(block + name, tp::ColwiseParallel());
    }
    plan.emplace_back(block + "attention.wo", tp::RowwiseParallel());
    plan.emplace_back(block + "feed_forward.w1", tp::ColwiseParallel());
    plan.emplace_back(block + "feed_forward.w3", tp::ColwiseParallel());
    plan.emplace_back(block + "feed_forward.w2", tp::RowwiseParallel());
  }
  return plan;
}

LlamaConfig llama3_config(int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t ffn_hidden,
                          bool tied) {
  LlamaConfig config;
  config.vocab_size = 128256;
  config.seq_len = 8192;
  config.d_model = d_model;
  config.n_layers = n_layers;
  config.n_heads = n_heads;
  config.n_kv_heads = 8;
  config.ffn_hidden = ffn_hidden;
  config.tie_weights = tied;
  return config;
}

int64_t llama_parameter_count(const LlamaConfig& c) {
  const int64_t head_dim = c.d_model / c.n_heads;
  const int64_t attention = c.d_model * head_dim * (2 * c.n_heads + 2 * c.n_kv_heads);
  const int64_t block = attention + 3 * c.d_model * c.ffn_hidden + 2 * c.d_model;
  const int64_t embeddings = c.vocab_size * c.d_model * (c.tie_weights ? 1 : 2);
  return c.n_layers * block + c.d_model + embeddings;
}

double llama_flops_per_token(const LlamaConfig& c) {
  const int64_t matmul_params =
      llama_parameter_count(c) - (c.tie_weights ? 0 : c.vocab_size * c.d_model);
  return 6.0 * static_cast<double>(matmul_params) +
         12.0 * static_cast<double>(c.n_layers * c.d_model * c.seq_len);
}

}  // namespace ddp::models
