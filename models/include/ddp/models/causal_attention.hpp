#pragma once
// Causal scaled dot-product attention for the zoo's GPT, in the regime users run: libtorch's fused
// at::scaled_dot_product_attention where it exists (torch >= 2.0: flash or memory-efficient
// kernels on CUDA), the written-out masked softmax on 1.13, which has no public fused op. A GPT
// with written-out attention is about 2.7x slower on a GPU and hides communication that a real
// model exposes (docs/benchmarks.md). bench/reference/zoo.py makes the same choice on the
// PyTorch side, so both sides of a comparison run the same attention.

#include <torch/types.h>

namespace ddp::models {

// q, k, v: [B, H, T, hd] -> [B, H, T, hd]. Position t attends to positions <= t; scale
// 1/sqrt(hd); no dropout. Fused where causal_attention_is_fused(), else
// written_out_causal_attention.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v);

// The same math as matmul, mask, softmax, matmul, available on every torch version: the 1.13
// path, and what the fused path is tested against.
torch::Tensor written_out_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v);

// true where causal_attention calls at::scaled_dot_product_attention (torch >= 2.0).
bool causal_attention_is_fused();

}  // namespace ddp::models
