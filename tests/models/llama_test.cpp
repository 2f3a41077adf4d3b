// The zoo's Llama (models/llama.hpp): one block against a float64 oracle written out here (RMSNorm,
// rotary embeddings as complex rotations, grouped-query attention by repeating each key/value head,
// one query position at a time, SwiGLU), forward and every parameter's gradient; the published
// parameter counts of Llama 3.2 1B / 3B and Llama 3.1 8B from the zoo's shapes; the tied rows.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "ddp/models/llama.hpp"
#include "ddp/models/registry.hpp"
#include "support/error_text.hpp"

namespace ddp::models {
namespace {

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto ref = want.to(torch::kDouble);
  return (got.to(torch::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
}

LlamaConfig small() {
  LlamaConfig c;
  c.d_model = 64;
  c.n_heads = 8;  // head dim 8
  c.n_kv_heads = 2;
  c.ffn_hidden = 96;
  c.seq_len = 12;
  c.rope_theta = 10000;  // angles that turn within 12 positions
  return c;
}

// The block in float64 from its weights, sharing nothing with llama.cpp but torch's basic ops.
torch::Tensor oracle_block(const torch::Tensor& x, LlamaBlockImpl& b, const LlamaConfig& c) {
  const auto w = [](const torch::nn::Linear& l) { return l->weight.to(torch::kDouble); };
  const auto rms = [&](const torch::Tensor& t, const RMSNorm& n) {
    return t / torch::sqrt(t.pow(2).mean(-1, true) + c.norm_eps) * n->weight.to(torch::kDouble);
  };
  const int64_t batch = x.size(0), seq = x.size(1), hd = c.d_model / c.n_heads;
  // Position t, pair i turns by t * theta^(-2i / hd): a multiplication by e^(i angle).
  const auto rotate = [&](const torch::Tensor& t) {  // [B, T, H, hd]
    auto z = torch::view_as_complex(t.reshape({batch, seq, t.size(2), hd / 2, 2}).contiguous());
    std::vector<double> angles;
    for (int64_t p = 0; p < seq; ++p) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        angles.push_back(static_cast<double>(p) * std::pow(c.rope_theta, -2.0 * i / hd));
      }
    }
    const auto a = torch::tensor(angles, torch::kDouble).view({1, seq, 1, hd / 2});
    const auto turn = torch::polar(torch::ones_like(a), a);
    return torch::view_as_real(z * turn).reshape({batch, seq, t.size(2), hd});
  };
  const auto h = rms(x, b.attention_norm);
  const auto q = rotate(torch::matmul(h, w(b.attention->wq).t()).view({batch, seq, -1, hd}));
  auto k = rotate(torch::matmul(h, w(b.attention->wk).t()).view({batch, seq, -1, hd}));
  auto v = torch::matmul(h, w(b.attention->wv).t()).view({batch, seq, -1, hd});
  k = k.repeat_interleave(c.n_heads / c.n_kv_heads, 2);
  v = v.repeat_interleave(c.n_heads / c.n_kv_heads, 2);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < seq; ++t) {                   // query t sees keys 0..t
    const auto qt = q.narrow(1, t, 1).transpose(1, 2);  // [B, H, 1, hd]
    const auto kt = k.narrow(1, 0, t + 1).transpose(1, 2);
    const auto vt = v.narrow(1, 0, t + 1).transpose(1, 2);
    const auto p = torch::softmax(torch::matmul(qt, kt.transpose(-2, -1)) / std::sqrt(hd), -1);
    rows.push_back(torch::matmul(p, vt).transpose(1, 2).reshape({batch, 1, -1}));
  }
  const auto attended = x + torch::matmul(torch::cat(rows, 1), w(b.attention->wo).t());
  const auto g = rms(attended, b.ffn_norm);
  const auto& ff = b.feed_forward;
  const auto a1 = torch::matmul(g, w(ff->w1).t());
  return attended +
         torch::matmul(a1 * torch::sigmoid(a1) * torch::matmul(g, w(ff->w3).t()), w(ff->w2).t());
}

TEST(LlamaBlock, ForwardAndGradientsMatchAFloat64Oracle) {
  const LlamaConfig c = small();
  torch::manual_seed(0);
  LlamaBlock block(c);
  {
    torch::NoGradGuard no_grad;  // norms away from ones, so their weights are tested
    block->attention_norm->weight.uniform_(0.5, 1.5);
    block->ffn_norm->weight.uniform_(0.5, 1.5);
  }
  auto [cos, sin] = rotary_tables(c.seq_len, c.d_model / c.n_heads, c.rope_theta);
  block->attention->set_rotary(cos, sin);
  const auto x = torch::randn({2, c.seq_len, c.d_model});
  const auto x32 = x.clone().requires_grad_(), x64 = x.to(torch::kDouble).requires_grad_();
  const auto got = block->forward(x32);
  const auto want = oracle_block(x64, *block, c);
  EXPECT_LT(relative_error(got, want), 1e-5);
  const auto probe = torch::randn_like(x);
  // The oracle reads the weights through float64 casts: its gradients with respect to them are
  // float64 sums, rounded once to fp32.
  const auto params = block->parameters();
  std::vector<torch::Tensor> wrt = params;
  wrt.push_back(x64);
  const auto want_grads = torch::autograd::grad({(want * probe.to(torch::kDouble)).sum()}, wrt);
  (got * probe).sum().backward();
  const auto names = block->named_parameters().keys();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(relative_error(params[i].grad(), want_grads[i]), 1e-5) << names[i];
  }
  EXPECT_LT(relative_error(x32.grad(), want_grads.back()), 1e-5) << "input";
}

TEST(Llama, ShapesGiveTheirPublishedParameterCounts) {
  // Llama 3.2 1B, 3.2 3B (tied) and 3.1 8B (untied), as Meta's model cards count them.
  const auto shape = llama3_config;
  EXPECT_EQ(llama_parameter_count(shape(2048, 16, 32, 8192, true)), 1235814400);
  EXPECT_EQ(llama_parameter_count(shape(3072, 28, 24, 8192, true)), 3212749824);
  EXPECT_EQ(llama_parameter_count(shape(4096, 32, 32, 14336, false)), 8030261248);
  // The built tiny model has what the formula says, a tied weight once.
  for (const bool tied : {false, true}) {
    LlamaConfig c = small();
    c.tie_weights = tied;
    Llama model(c);
    int64_t distinct = 0;
    for (const auto& p : model->parameters()) distinct += p.numel();
    if (tied) distinct -= c.vocab_size * c.d_model;  // listed under both names
    EXPECT_EQ(distinct, llama_parameter_count(c)) << "tied " << tied;
  }
}

TEST(Llama, TheTiedRowSharesTheEmbeddingAndTheModelTrainsOnCountingSequences) {
  LlamaConfig c = small();
  c.tie_weights = true;
  Llama model(c);
  EXPECT_TRUE(model->output->weight.is_same(model->tok_embeddings->weight));
  WorkloadOptions o;
  o.dim = 32;
  o.n_layers = 2;
  o.seq_len = 16;
  Workload w = make_workload("llama-tiny", o);
  // Untied (llama-tiny, as llama-8b): the embedding and the output are units of their own.
  EXPECT_EQ(w.wrap_units,
            (std::vector<std::string>{"tok_embeddings", "layers.0", "layers.1", "output"}));
  auto [x, y] = w.batch(0, 8);
  torch::optim::AdamW opt(w.ptr->parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const auto loss = w.loss(w.module.forward(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "from " << first;
  o.dropout = 0.1;
  EXPECT_EQ(testing::error_of([&] { make_workload("llama-tiny", o); }),
            "make_workload('llama-tiny'): the Llama models have no dropout (Llama 3 trains "
            "without it)");
}

}  // namespace
}  // namespace ddp::models
