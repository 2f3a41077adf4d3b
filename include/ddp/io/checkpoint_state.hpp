#pragma once
// The training state a checkpoint holds, flattened into named tensors (one map per file) and put
// back: a module's parameters and buffers, an optimizer's per-parameter state, the CPU random
// generator. Pure conversions, no files: checkpoint.cpp decides where the maps go.

#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "ddp/io/safetensors.hpp"

namespace ddp::io {

// named_parameters() then named_buffers() of `model`, detached, by their dotted names. A tied
// parameter appears under each of its names (same values).
TensorMap model_tensors(const torch::nn::Module& model);

// Checks, changing nothing, that `tensors` matches the model's parameters and buffers: the same
// names, shapes and dtypes. Throws naming the tensor and `source` (the file it came from).
void check_model_tensors(const torch::nn::Module& model, const TensorMap& tensors,
                         const std::string& source);

// Copies `tensors` into the model's parameters and buffers (no autograd, each on its own device
// and dtype). Refuses a missing or unexpected name, or a shape/dtype change, naming the tensor and
// `source` (the file it came from), before changing anything.
void load_model_tensors(torch::nn::Module& model, const TensorMap& tensors,
                        const std::string& source);

// "sgd", "adam", "adamw", "rmsprop" or "adagrad": torch::optim's SGD, Adam, AdamW, RMSprop and
// Adagrad, and the house's optimizers derived from them (optim/sgd.hpp, optim/adam.hpp); refuses
// other optimizers, whose state we do not know how to capture.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

// The optimizer's per-parameter state keyed "<parameter name>.<field>", the parameter named as in
// `model`, under PyTorch's state_dict names: SGD "momentum_buffer"; Adam and AdamW "exp_avg",
// "exp_avg_sq", "max_exp_avg_sq" (amsgrad only) and "step" (an int64 scalar; the house's device
// count written into it); RMSprop "square_avg", "momentum_buffer", "grad_avg"; Adagrad "sum" and
// "step". Parameters the optimizer has not stepped yet have no entries.
// Every optimizer parameter must be a parameter of `model` (that is how it is named).
TensorMap optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& model);

// Replaces the optimizer's per-parameter state with the one in `tensors` (parameters without
// entries get none, as before their first step). Options (lr, betas, ...) are the optimizer's own,
// not restored: build it as the run that saved did.
void load_optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& model,
                            const TensorMap& tensors, const std::string& source);

// {"cpu": the default CPU generator's state (U8)}. CUDA generators are not captured.
TensorMap rng_tensors();
// Checks that `tensors` holds a CPU generator state of this libtorch's size, changing nothing.
void check_rng_tensors(const TensorMap& tensors, const std::string& source);
void load_rng_tensors(const TensorMap& tensors, const std::string& source);

}  // namespace ddp::io
