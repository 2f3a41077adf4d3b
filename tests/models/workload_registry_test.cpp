// The registry's learning rate, known before any model is built (the tools check a schedule
// against it before their workers start): the rate make_workload gives, in closed form.

#include <gtest/gtest.h>

#include <string>

#include "ddp/models/registry.hpp"
#include "support/error_text.hpp"

namespace ddp::models {
namespace {

// Net's loss sums over its features, so its rate falls as 20 / width, at most 0.05; every other
// model keeps Workload's 0.05.
TEST(WorkloadRegistry, LearningRateInClosedForm) {
  EXPECT_DOUBLE_EQ(workload_lr("net"), 0.01);
  EXPECT_DOUBLE_EQ(workload_lr("toy"), 0.01);
  EXPECT_DOUBLE_EQ(workload_lr("toy8k"), 20.0 / 8192);
  WorkloadOptions narrow;
  narrow.dim = 100;
  EXPECT_DOUBLE_EQ(workload_lr("net", narrow), 0.05);
  for (const char* name : {"mlp", "mlp-deep", "gpt", "gpt-tiny", "gpt2-small", "gpt2-medium",
                           "gpt-char", "resnet-small"}) {
    EXPECT_DOUBLE_EQ(workload_lr(name), 0.05) << name;
  }
}

// The rate without a model is the built model's, for the widths that change it.
TEST(WorkloadRegistry, LearningRateIsTheBuiltModels) {
  for (const int64_t dim : {0, 100, 800}) {
    WorkloadOptions options;
    options.dim = dim;
    for (const char* name : {"net", "toy", "mlp", "gpt"}) {
      EXPECT_DOUBLE_EQ(workload_lr(name, options), make_workload(name, options).lr)
          << name << " dim " << dim;
    }
  }
}

// The sequence length without a model is the built model's (its batches' length), for the rows
// cheap to build; the Llama 3 rows' is their context, 8192; a model without tokens has none.
TEST(WorkloadRegistry, SequenceLengthIsTheBuiltModels) {
  for (const int64_t seq_len : {0, 16}) {
    WorkloadOptions options;
    options.seq_len = seq_len;
    for (const char* name : {"gpt", "gpt-tiny", "gpt-char", "llama-tiny"}) {
      EXPECT_EQ(workload_seq_len(name, options),
                make_workload(name, options).batch(0, 1).first.size(1))
          << name << " seq_len " << seq_len;
    }
  }
  EXPECT_EQ(workload_seq_len("llama-8b"), 8192);
  EXPECT_EQ(workload_seq_len("mlp"), 0);
}

TEST(WorkloadRegistry, AnUnknownNameIsRefusedWithTheValidOnes) {
  EXPECT_EQ(ddp::testing::error_of([] { workload_lr("gpt3"); }),
            "workload_lr: unknown workload 'gpt3'; valid names: net, toy, toy8k, mlp, mlp-deep, "
            "gpt, gpt-tiny, gpt2-small, gpt2-medium, gpt-char, llama-tiny, llama-1b, llama-3b, "
            "llama-8b, resnet-small");
}

}  // namespace
}  // namespace ddp::models
