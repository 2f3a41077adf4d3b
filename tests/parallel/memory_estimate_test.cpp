// The memory plan (parallel/memory_estimate.hpp) in closed form: a model of three parameters,
// [6, 4], [6] and [3, 4] in fp32, the first two in unit "a", at world 2 and 4, with and without
// bf16 gathers; and the refusal's exact text.

#include "ddp/parallel/memory_estimate.hpp"

#include <gtest/gtest.h>

namespace ddp::testing {
namespace {

parallel::MemoryInputs model(int world) {
  parallel::MemoryInputs in;
  in.params = {{"a.weight", {6, 4}}, {"a.bias", {6}}, {"head.weight", {3, 4}}};
  in.units = {"a"};
  in.world = world;
  in.optimizer_state_per_param_byte = 2;
  in.activation_bytes = 1000;
  return in;
}

TEST(MemoryEstimate, EveryStyleInClosedForm) {
  const auto e = parallel::estimate_memory(model(2));
  ASSERT_EQ(e.size(), 3u);
  // replicate: (24 + 6 + 12) x 4 bytes each of parameters and gradients, twice that of state.
  EXPECT_EQ(e[0].style, shard::DataParallelStyle::kReplicate);
  EXPECT_EQ(e[0].params, 168);
  EXPECT_EQ(e[0].grads, 168);
  EXPECT_EQ(e[0].optimizer_state, 336);
  EXPECT_EQ(e[0].gathered, 0);
  EXPECT_EQ(e[0].activations, 1000);
  EXPECT_EQ(e[0].held(), 672);
  // fully_shard at world 2: rows 3 of 6, 3 of 6, 2 of 3 (padded) -> (12 + 3 + 8) x 4 = 92.
  // Gathered: the root (head, 16 padded elements) and two of unit a (30 elements) in forward;
  // backward adds a's gradients and reduce input: 4 x (16 + 2 x 30 + 2 x 30) = 544; the end of
  // backward 4 x 3 x 16 = 192.
  EXPECT_EQ(e[1].style, shard::DataParallelStyle::kFullyShard);
  EXPECT_EQ(e[1].params, 92);
  EXPECT_EQ(e[1].grads, 92);
  EXPECT_EQ(e[1].optimizer_state, 184);
  EXPECT_EQ(e[1].gathered, 544);
  // default at world 2: head's 3 rows do not divide: replicated (48 bytes), no root gather.
  EXPECT_EQ(e[2].style, shard::DataParallelStyle::kDefault);
  EXPECT_EQ(e[2].params, 60 + 48);
  EXPECT_EQ(e[2].gathered, 4 * (2 * 30 + 2 * 30));
}

TEST(MemoryEstimate, Bf16GathersHalveTheGatheredUnits) {
  parallel::MemoryInputs in = model(2);
  in.param_dtype = c10::kBFloat16;
  in.reduce_dtype = c10::kFloat;
  in.prefetch = false;
  const auto e = parallel::estimate_memory(in);
  // forward 2 x (16 + 30); backward + 30 x (2 + 4); end of backward 16 x (2 x 2 + 4).
  EXPECT_EQ(e[1].gathered, 2 * (16 + 30) + 30 * 6);
}

// Llama 3.1 8B's shapes (8,030,261,248 parameters), a unit per block, at `world`.
parallel::MemoryInputs llama_8b(int world) {
  parallel::MemoryInputs in;
  const int64_t d = 4096, kv = 1024, ffn = 14336, vocab = 128256;
  in.params.push_back({"tok_embeddings.weight", {vocab, d}});
  for (int i = 0; i < 32; ++i) {
    const std::string b = "layers." + std::to_string(i) + ".";
    in.units.push_back("layers." + std::to_string(i));
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"attention_norm.weight", {d}},
             {"attention.wq.weight", {d, d}},
             {"attention.wk.weight", {kv, d}},
             {"attention.wv.weight", {kv, d}},
             {"attention.wo.weight", {d, d}},
             {"ffn_norm.weight", {d}},
             {"feed_forward.w1.weight", {ffn, d}},
             {"feed_forward.w2.weight", {d, ffn}},
             {"feed_forward.w3.weight", {ffn, d}}}) {
      in.params.push_back({b + name, shape});
    }
  }
  in.params.push_back({"norm.weight", {d}});
  in.params.push_back({"output.weight", {vocab, d}});
  in.world = world;
  return in;
}

TEST(MemoryEstimate, Llama8bAtWorld4MatchesTheMeasuredState) {
  // Measured at world 4 (docs/benchmarks.md): 8,030,261,248 bytes of parameters and of gradients
  // and 16,060,524,824 of AdamW state a rank.
  const auto e = parallel::estimate_memory(llama_8b(4));
  EXPECT_EQ(e[0].params, int64_t{4} * 8030261248);
  EXPECT_EQ(e[1].params, 8030261248);
  EXPECT_EQ(e[1].grads, 8030261248);
  EXPECT_EQ(e[1].optimizer_state, 2 * int64_t{8030261248});
}

TEST(MemoryEstimate, ARefusalNamesTheNumbersAndTheStyleThatFits) {
  const auto e = parallel::estimate_memory(llama_8b(4));
  const int64_t h100 = 80000000000;
  EXPECT_EQ(parallel::memory_refusal(e, shard::DataParallelStyle::kFullyShard, h100, 4), "");
  EXPECT_EQ(parallel::memory_refusal(e, shard::DataParallelStyle::kReplicate, h100, 4),
            "ddp: style replicate needs an estimated 128.48 GB a rank before activations "
            "(parameters 32.12 GB, gradients 32.12 GB, optimizer state 64.24 GB, gathered 0.00 "
            "GB; activations not estimated) but the device holds 80.00 GB; style fully_shard "
            "fits: 44.73 GB a rank");
  EXPECT_EQ(parallel::memory_refusal(parallel::estimate_memory(llama_8b(1)),
                                     shard::DataParallelStyle::kFullyShard, h100, 1),
            "ddp: style fully_shard needs an estimated 141.09 GB a rank before activations "
            "(parameters 32.12 GB, gradients 32.12 GB, optimizer state 64.24 GB, gathered 12.61 "
            "GB; activations not estimated) but the device holds 80.00 GB; no style fits at "
            "world 1: use more ranks");
}

}  // namespace
}  // namespace ddp::testing
