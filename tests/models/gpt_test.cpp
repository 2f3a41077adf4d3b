// The zoo's GPT in the regime users run: causal attention (fused at::scaled_dot_product_attention
// on torch >= 2.0, written out on 1.13; models/causal_attention.hpp) against a float64 oracle
// computed one query position at a time, forward and backward, on the CPU and on a GPU where there
// is one; and the tied wte / lm_head weight (WorkloadOptions::tie_weights, --tie-weights).

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "ddp/models/causal_attention.hpp"
#include "ddp/models/gpt.hpp"
#include "ddp/models/registry.hpp"
#include "support/error_text.hpp"

namespace ddp::models {
namespace {

// softmax_j<=t(q_t . k_j / sqrt(hd)) v_j in float64, one query position t at a time: no mask and
// no -inf, nothing shared with the code under test but matmul and softmax.
torch::Tensor oracle_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
  const int64_t seq = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < seq; ++t) {
    const auto seen = k.narrow(-2, 0, t + 1);  // keys 0..t
    const auto scores = torch::matmul(q.narrow(-2, t, 1), seen.transpose(-2, -1)) * scale;
    rows.push_back(torch::matmul(torch::softmax(scores, -1), v.narrow(-2, 0, t + 1)));
  }
  return torch::cat(rows, -2);
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto ref = want.to(torch::kCPU, torch::kDouble);
  return (got.to(torch::kCPU, torch::kDouble) - ref).norm().item<double>() /
         ref.norm().item<double>();
}

// Output and the gradients of q, k, v (through a random projection of the output) within `tol` of
// the oracle's. An odd T and a T of 1 (the first position sees only itself).
void expect_matches_oracle(const torch::Device& device, double tol) {
  SCOPED_TRACE(std::string("device ") + device.str() + ", attention " +
               (causal_attention_is_fused() ? "fused" : "written out"));
  torch::manual_seed(7);
  for (const int64_t seq : {int64_t{7}, int64_t{1}}) {
    const auto opts = torch::TensorOptions().device(device);
    auto q = torch::randn({2, 3, seq, 8}, opts).requires_grad_();
    auto k = torch::randn({2, 3, seq, 8}, opts).requires_grad_();
    auto v = torch::randn({2, 3, seq, 8}, opts).requires_grad_();
    const auto w = torch::randn({2, 3, seq, 8}, opts);
    const auto out = causal_attention(q, k, v);
    (out * w).sum().backward();

    auto qd = q.detach().to(torch::kDouble).requires_grad_();
    auto kd = k.detach().to(torch::kDouble).requires_grad_();
    auto vd = v.detach().to(torch::kDouble).requires_grad_();
    const auto want = oracle_attention(qd, kd, vd);
    (want * w.to(torch::kDouble)).sum().backward();

    EXPECT_EQ(out.sizes(), want.sizes());
    EXPECT_LT(relative_error(out, want), tol) << "output, T=" << seq;
    EXPECT_LT(relative_error(v.grad(), vd.grad()), tol) << "dv, T=" << seq;
    if (seq == 1) {
      // One key: the softmax is 1 whatever q and k are, so their gradients are 0 in closed form
      // (a fused kernel may leave rounding residue of dP - rowsum(dP * P)).
      EXPECT_LT(q.grad().abs().max().item<double>(), 1e-6) << "dq, T=1";
      EXPECT_LT(k.grad().abs().max().item<double>(), 1e-6) << "dk, T=1";
      continue;
    }
    EXPECT_LT(relative_error(q.grad(), qd.grad()), tol) << "dq, T=" << seq;
    EXPECT_LT(relative_error(k.grad(), kd.grad()), tol) << "dk, T=" << seq;
  }
}

TEST(GptModel, CausalAttentionMatchesAFloat64OracleOnTheCpu) {
  expect_matches_oracle(torch::kCPU, 1e-5);
}

// Run by scripts/gpu-check.sh on the device machine; skipped without CUDA (CI). The fused
// kernels (memory-efficient attention for fp32) sum in another order than the oracle: 1e-4, which
// a wrong mask or scale (errors of order 1) cannot meet.
TEST(GptModel, CausalAttentionMatchesAFloat64OracleOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_matches_oracle(torch::Device(torch::kCUDA, 0), 1e-4);
}

TEST(GptModel, WithoutFusedAttentionTheWrittenOutFormRuns) {
  // The written-out form is what causal_attention runs where it is not fused: bit for bit.
  if (causal_attention_is_fused()) GTEST_SKIP() << "torch >= 2.0: the fused path is in use";
  torch::manual_seed(3);
  const auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 5, 4}),
             v = torch::randn({1, 2, 5, 4});
  EXPECT_TRUE(torch::equal(causal_attention(q, k, v), written_out_causal_attention(q, k, v)));
}

// Changing tokens from position 10 on leaves the logits of positions 0..9 exactly as they were.
TEST(GptModel, ALaterTokenChangesNoEarlierLogit) {
  torch::manual_seed(0);
  GPT gpt(GPTConfig{});
  torch::NoGradGuard no_grad;
  const auto idx = torch::randint(0, 4096, {1, 16}, torch::kLong);
  auto changed = idx.clone();
  changed.narrow(1, 10, 6).add_(1).remainder_(4096);
  const auto a = gpt->forward(idx), b = gpt->forward(changed);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 10), b.narrow(1, 0, 10)));
  EXPECT_FALSE(torch::equal(a.narrow(1, 10, 6), b.narrow(1, 10, 6)));
}

TEST(GptModel, TiedWeightsAreOneTensorUnderTwoNames) {
  EXPECT_EQ(tied_weights_workload_names(),
            (std::vector<std::string>{"gpt", "gpt-tiny", "gpt2-small", "gpt2-medium", "gpt-char"}));
  WorkloadOptions tied;
  tied.tie_weights = true;
  const auto untied_w = make_workload("gpt");
  auto tied_w = make_workload("gpt", tied);
  const auto params = tied_w.ptr->named_parameters();
  EXPECT_TRUE(params["lm_head.weight"].is_same(params["wte.weight"]));
  EXPECT_FALSE(untied_w.ptr->named_parameters()["lm_head.weight"].is_same(
      untied_w.ptr->named_parameters()["wte.weight"]));
  // libtorch lists the tied tensor under both names: the same count, one tensor fewer distinct.
  EXPECT_EQ(params.size(), untied_w.ptr->named_parameters().size());
  // The same seed draws the same wte; the tied lm_head is that wte (vocab 256 x d_model 64).
  EXPECT_TRUE(torch::equal(params["wte.weight"], untied_w.ptr->named_parameters()["wte.weight"]));
  EXPECT_EQ(params["lm_head.weight"].sizes(), (std::vector<int64_t>{256, 64}));
  // Forward and backward run through both uses of the tied weight.
  auto [x, y] = tied_w.batch(0, 4);
  tied_w.loss(tied_w.module.forward(x), y).backward();
  EXPECT_TRUE(params["wte.weight"].grad().defined());
}

TEST(GptModel, TieWeightsIsRefusedForAModelWithoutAnEmbedding) {
  WorkloadOptions tied;
  tied.tie_weights = true;
  EXPECT_EQ(ddp::testing::error_of([&] { make_workload("toy", tied); }),
            "make_workload('toy'): tie_weights needs a model with a token embedding and an output "
            "layer to tie; the workloads that have them: gpt, gpt-tiny, gpt2-small, gpt2-medium, "
            "gpt-char");
}

}  // namespace
}  // namespace ddp::models
