#include "ddp/models/causal_attention.hpp"

#include <cmath>
#include <limits>

#include "ddp/detail/torch_compat.hpp"

#if DDP_HAVE_SDPA
#include <ATen/ops/scaled_dot_product_attention.h>
#endif

namespace ddp::models {

torch::Tensor written_out_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v) {
  const int64_t seq = q.size(-2);
  const int64_t head_dim = q.size(-1);
  auto att =
      torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  // Built per call for this T rather than kept as a seq_len^2 buffer, so the model has no buffers
  // to broadcast and shorter inputs pay only for their own size.
  const auto future = torch::ones({seq, seq}, q.options().dtype(torch::kBool)).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
  att = torch::softmax(att, /*dim=*/-1);
  return torch::matmul(att, v);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
#if DDP_HAVE_SDPA
  // Positional and minimal, so that the call compiles from 2.0 (no `scale`) to 2.11 (`scale`,
  // `enable_gqa` added with defaults): no mask, no dropout, is_causal. The default scale is
  // 1/sqrt(hd), the written-out form's.
  return at::scaled_dot_product_attention(q, k, v, {}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  return written_out_causal_attention(q, k, v);
#endif
}

bool causal_attention_is_fused() { return DDP_HAVE_SDPA != 0; }

}  // namespace ddp::models
