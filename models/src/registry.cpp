#include "ddp/models/registry.hpp"

#include <algorithm>

#include <c10/util/Exception.h>
#include <torch/utils.h>

#include "ddp/models/gpt.hpp"
#include "ddp/models/llama.hpp"
#include "ddp/models/mlp.hpp"
#include "ddp/models/net.hpp"
#include "ddp/models/resnet.hpp"
#include "ddp/models/tasks.hpp"

namespace ddp::models {
namespace {

int64_t pick(int64_t dim, int64_t fallback) { return dim == 0 ? fallback : dim; }

// Net's SGD rate: its loss sums over the features, so its gradient grows with the width. 0.01 at
// the seed width 2000.
double net_lr(int64_t dim) { return std::min(0.05, 20.0 / static_cast<double>(dim)); }

void build_net(Workload& w, int64_t dim, uint64_t seed) {
  Net net(dim);
  set_model(w, net);
  w.set_checkpointing = [impl = net.ptr()](bool on) { impl->checkpoint_units = on; };
  w.wrap_units = {"fc1", "fc2", "fc3", "fc4"};
  w.tp_plan = {{"fc1", tp::ColwiseParallel()},
               {"fc2", tp::RowwiseParallel()},
               {"fc3", tp::ColwiseParallel()},
               {"fc4", tp::RowwiseParallel()}};
  add_regression_task(w, dim, dim, seed);
}

void build_mlp(Workload& w, const MLPOptions& options, uint64_t seed) {
  MLP mlp(options);
  set_model(w, mlp);
  w.set_checkpointing = [impl = mlp.ptr()](bool on) { impl->checkpoint_units = on; };
  for (int64_t i = 0; i < options.depth; ++i) w.wrap_units.push_back("layers." + std::to_string(i));
  add_regression_task(w, options.in, options.out, seed);
}

// Workload::activation_bytes of a decoder of `layers` blocks of width `d` over `vocab` tokens.
std::function<int64_t(int64_t, int64_t, bool, int64_t)> decoder_activations(int64_t layers,
                                                                            int64_t d,
                                                                            int64_t vocab) {
  return [layers, d, vocab](int64_t batch, int64_t seq, bool checkpointing, int64_t element) {
    const int64_t tokens = batch * seq;
    const int64_t layer = 17 * element * tokens * d;  // 34 s b h at 2 bytes
    const int64_t blocks = checkpointing ? layers * tokens * d * element + layer : layers * layer;
    return blocks + tokens * vocab * (element + 4);
  };
}

// The GPT rows' shapes, with the options every GPT takes (tie_weights, seed).
void build_gpt(Workload& w, GPTConfig config, const WorkloadOptions& options) {
  config.tie_weights = options.tie_weights;
  config.n_layers = pick(options.n_layers, config.n_layers);
  config.n_heads = pick(options.n_heads, config.n_heads);
  config.seq_len = pick(options.seq_len, config.seq_len);
  config.dropout = options.dropout;
  GPT gpt(config);
  set_model(w, gpt);
  w.set_checkpointing = [impl = gpt.ptr()](bool on) { impl->checkpoint_units = on; };
  for (int64_t i = 0; i < config.n_layers; ++i) w.wrap_units.push_back("h." + std::to_string(i));
  w.tp_plan = gpt_tensor_parallel_plan(config);
  int64_t params = 0;  // distinct (a tied lm_head counts once), without wpe
  for (const auto& p : gpt->parameters()) params += p.numel();
  if (config.tie_weights) params -= config.vocab_size * config.d_model;
  params -= config.seq_len * config.d_model;
  w.flops_per_token = 6.0 * static_cast<double>(params) +
                      12.0 * static_cast<double>(config.n_layers * config.d_model * config.seq_len);
  w.activation_bytes = decoder_activations(config.n_layers, config.d_model, config.vocab_size);
  add_counting_task(w, config.vocab_size, config.seq_len, options.seed);
}

// The Llama rows' shapes, with the options every Llama takes (n_layers, n_heads, seq_len, seed;
// tie_weights is the row's own: Llama 3.2 1B and 3B are tied, 3.1 8B is not).
void build_llama(Workload& w, LlamaConfig config, const WorkloadOptions& options) {
  TORCH_CHECK(options.dropout == 0, "make_workload('", w.name,
              "'): the Llama models have no dropout (Llama 3 trains without it)");
  config.n_layers = pick(options.n_layers, config.n_layers);
  config.n_heads = pick(options.n_heads, config.n_heads);
  config.seq_len = pick(options.seq_len, config.seq_len);
  Llama llama(config);
  set_model(w, llama);
  w.set_checkpointing = [impl = llama.ptr()](bool on) { impl->checkpoint_units = on; };
  // Untied, the embedding and the output layer are units of their own (torchtitan's wrapping):
  // the root (then the final norm alone) would hold both gathered for the whole step, gather them
  // before any compute and reduce-scatter them after the last backward kernel (7.4 ms at llama-8b
  // on 2 GPUs: docs/benchmarks.md, "The batch-1 regime"); as units the output's reduce-scatter
  // runs under the blocks' backward and each is released after its forward. Tied, the one weight
  // belongs to both, so they stay in the root.
  if (!config.tie_weights) w.wrap_units.push_back("tok_embeddings");
  for (int64_t i = 0; i < config.n_layers; ++i) {
    w.wrap_units.push_back("layers." + std::to_string(i));
  }
  if (!config.tie_weights) w.wrap_units.push_back("output");
  w.tp_plan = llama_tensor_parallel_plan(config);
  w.flops_per_token = llama_flops_per_token(config);
  w.activation_bytes = decoder_activations(config.n_layers, config.d_model, config.vocab_size);
  add_counting_task(w, config.vocab_size, config.seq_len, options.seed);
}

struct Entry {
  const char* name;
  // Whether WorkloadOptions::tie_weights applies: the model has a token embedding and an output
  // layer of its shape (the GPTs; a Llama row's tying is its own).
  bool ties_weights;
  // Whether WorkloadOptions::n_layers, n_heads and seq_len apply (the GPTs and the Llamas).
  bool shaped;
  // The row's sequence length (WorkloadOptions::seq_len 0), known without building the model
  // (ddp-train --data checks the text against it in the launcher); 0 for a model without tokens.
  int64_t seq_len;
  void (*build)(Workload& w, const WorkloadOptions& options);  // options.dim 0 = default
  // Workload::lr, known without building the model (the tools check a schedule against it
  // before any worker starts); options.dim 0 = default.
  double (*lr)(const WorkloadOptions& options);
};

// Workload::lr's default, for every model whose loss does not grow with its width.
double default_lr(const WorkloadOptions& /*options*/) { return Workload{}.lr; }

// One row per workload; the order is the order of workload_names().
const Entry kEntries[] = {
    {"net", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) { build_net(w, pick(o.dim, 2000), o.seed); },
     [](const WorkloadOptions& o) { return net_lr(pick(o.dim, 2000)); }},
    {"toy", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) { build_net(w, pick(o.dim, 2000), o.seed); },
     [](const WorkloadOptions& o) { return net_lr(pick(o.dim, 2000)); }},
    {"toy8k", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) { build_net(w, pick(o.dim, 8192), o.seed); },
     [](const WorkloadOptions& o) { return net_lr(pick(o.dim, 8192)); }},
    {"mlp", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) {
       const int64_t width = pick(o.dim, 64);
       build_mlp(w, MLPOptions{width, width, width, 4}, o.seed);
     },
     default_lr},
    {"mlp-deep", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) {
       MLPOptions options;
       if (o.dim != 0) options.in = options.hidden = options.out = o.dim;
       build_mlp(w, options, o.seed);
     },
     default_lr},
    {"gpt", true, true, 32,
     [](Workload& w, const WorkloadOptions& o) {
       // Small enough that 100 CPU steps take seconds.
       GPTConfig config;
       config.vocab_size = 256;
       config.seq_len = 32;
       config.d_model = pick(o.dim, 64);
       config.n_layers = 2;
       build_gpt(w, config, o);
     },
     default_lr},
    {"gpt-tiny", true, true, 128,
     [](Workload& w, const WorkloadOptions& o) {
       GPTConfig config;
       config.d_model = pick(o.dim, config.d_model);
       build_gpt(w, config, o);
     },
     default_lr},
    {"gpt2-small", true, true, 1024,
     [](Workload& w, const WorkloadOptions& o) {
       // GPT-2 small's shape (124 M parameters untied), vocab padded to 50304 as in nanoGPT.
       GPTConfig config;
       config.vocab_size = 50304;
       config.seq_len = 1024;
       config.d_model = pick(o.dim, 768);
       config.n_heads = 12;
       config.n_layers = 12;
       build_gpt(w, config, o);
     },
     default_lr},
    {"gpt2-medium", true, true, 1024,
     [](Workload& w, const WorkloadOptions& o) {
       GPTConfig config;
       config.vocab_size = 50304;
       config.seq_len = 1024;
       config.d_model = pick(o.dim, 1024);
       config.n_heads = 16;
       config.n_layers = 24;
       build_gpt(w, config, o);
     },
     default_lr},
    {"gpt-char", true, true, 256,
     [](Workload& w, const WorkloadOptions& o) {
       // A small character-level GPT (nanoGPT's shakespeare_char shape: 6 layers, 384 wide, 6
       // heads, 256 tokens), byte vocabulary: every step is launch-bound on a GPU, the regime
       // CUDA graphs are for (docs/cuda_graphs.md).
       GPTConfig config;
       config.vocab_size = 256;
       config.seq_len = 256;
       config.d_model = pick(o.dim, 384);
       config.n_heads = 6;
       config.n_layers = 6;
       build_gpt(w, config, o);
     },
     default_lr},
    {"llama-tiny", false, true, 128,
     [](Workload& w, const WorkloadOptions& o) {
       // The CPU tests' Llama: 8 heads sharing 2 key/value heads, 128 tokens.
       LlamaConfig config;
       config.d_model = pick(o.dim, config.d_model);
       build_llama(w, config, o);
     },
     default_lr},
    {"llama-1b", false, true, 8192,
     [](Workload& w, const WorkloadOptions& o) {
       build_llama(w, llama3_config(pick(o.dim, 2048), 16, 32, 8192, /*tied=*/true), o);
     },
     default_lr},
    {"llama-3b", false, true, 8192,
     [](Workload& w, const WorkloadOptions& o) {
       build_llama(w, llama3_config(pick(o.dim, 3072), 28, 24, 8192, /*tied=*/true), o);
     },
     default_lr},
    {"llama-8b", false, true, 8192,
     [](Workload& w, const WorkloadOptions& o) {
       build_llama(w, llama3_config(pick(o.dim, 4096), 32, 32, 14336, /*tied=*/false), o);
     },
     default_lr},
    {"resnet-small", false, false, 0,
     [](Workload& w, const WorkloadOptions& o) {
       const int64_t classes = 10;
       set_model(w, ResNetSmall(classes, pick(o.dim, 64), o.sync_batch_norm));
       w.wrap_units = {"layer1", "layer2", "layer3", "layer4"};
       add_image_class_task(w, classes, o.seed);
     },
     default_lr},
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<std::string> workload_names() {
  std::vector<std::string> names;
  for (const auto& entry : kEntries) names.emplace_back(entry.name);
  return names;
}

int64_t workload_seq_len(const std::string& name, const WorkloadOptions& options) {
  for (const auto& entry : kEntries) {
    if (name != entry.name) continue;
    return entry.shaped ? pick(options.seq_len, entry.seq_len) : 0;
  }
  TORCH_CHECK(false, "workload_seq_len: unknown workload '", name,
              "'; valid names: ", joined(workload_names()));
}

std::vector<std::string> shaped_workload_names() {
  std::vector<std::string> names;
  for (const auto& entry : kEntries) {
    if (entry.shaped) names.emplace_back(entry.name);
  }
  return names;
}

std::vector<std::string> tied_weights_workload_names() {
  std::vector<std::string> names;
  for (const auto& entry : kEntries) {
    if (entry.ties_weights) names.emplace_back(entry.name);
  }
  return names;
}

Workload make_workload(const std::string& name, const WorkloadOptions& options) {
  TORCH_CHECK(options.dim >= 0, "make_workload('", name,
              "'): dim must be >= 0 (0 = the model's default), got ", options.dim);
  for (const auto& entry : kEntries) {
    if (name != entry.name) continue;
    TORCH_CHECK(!options.tie_weights || entry.ties_weights, "make_workload('", name,
                "'): tie_weights needs a model with a token embedding and an output layer to "
                "tie; the workloads that have them: ",
                joined(tied_weights_workload_names()));
    Workload w;
    w.name = name;
    // Parameters are drawn from the global generator during construction; seeding it here makes
    // every process build the same initial model without a broadcast.
    torch::manual_seed(options.seed);
    entry.build(w, options);
    w.lr = entry.lr(options);
    return w;
  }
  TORCH_CHECK(false, "make_workload: unknown workload '", name,
              "'; valid names: ", joined(workload_names()));
}

double workload_lr(const std::string& name, const WorkloadOptions& options) {
  for (const auto& entry : kEntries) {
    if (name == entry.name) return entry.lr(options);
  }
  TORCH_CHECK(false, "workload_lr: unknown workload '", name,
              "'; valid names: ", joined(workload_names()));
}

}  // namespace ddp::models
