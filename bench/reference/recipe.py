"""The GPT training recipe (nanoGPT's train.py) on PyTorch's side of the comparisons: the checks
of its flags, the learning-rate schedule, AdamW's weight-decay groups and the optimizer, as
torch_ddp.py uses them. The C++ side: tools/common/recipe_flags.cpp, optim/lr_schedule.cpp,
optim/param_groups.cpp (docs/training.md)."""

import math

import torch


LR_DECAYS = ("constant", "linear", "cosine")


def recipe_error(args):
    """Why the recipe flags cannot run (None when they can). The schedule's checks and texts are
    optim/lr_schedule.cpp's schedule_error, so that both sides refuse the same command lines."""
    if args.grad_clip < 0:
        return f"--grad-clip must be >= 0 (0: off), got {args.grad_clip}"
    if args.grad_accum < 1:
        return f"--grad-accum must be >= 1, got {args.grad_accum}"
    if args.weight_decay < 0:
        return f"--weight-decay must be >= 0, got {args.weight_decay}"
    if not 0 <= args.beta2 < 1:
        return f"--beta2 must be in [0, 1), got {args.beta2}"
    if args.warmup_steps < 0 or args.lr_decay_steps < 0:
        return (f"--warmup-steps and --lr-decay-steps must be >= 0, got {args.warmup_steps} and "
                f"{args.lr_decay_steps}")
    if scheduled(args):  # a constant --lr is today's behaviour: no new checks on it
        if not (args.lr > 0 and math.isfinite(args.lr)):
            return f"--lr must be a positive number, got {args.lr}"
        if not 0 <= args.min_lr <= args.lr:
            return f"--min-lr must be between 0 and --lr ({args.lr}), got {args.min_lr}"
        if args.lr_decay != "constant" and args.lr_decay_steps == 0:
            return (f"a {args.lr_decay} decay needs --lr-decay-steps (the step at which it reaches "
                    "--min-lr)")
        if args.lr_decay != "constant" and args.warmup_steps > args.lr_decay_steps:
            return (f"--warmup-steps ({args.warmup_steps}) must not exceed --lr-decay-steps "
                    f"({args.lr_decay_steps}): the decay would end before the warmup")
    if args.cuda_graph:
        # The captured step bakes in one SGD update at one rate: anything else would need its own
        # capture recipe, and the reference keeps PyTorch's documented one only.
        extra = [flag for flag, on in (("--grad-accum", args.grad_accum > 1),
                                       ("--grad-clip", args.grad_clip > 0),
                                       ("--optimizer", args.optimizer != "sgd"),
                                       ("an lr schedule", scheduled(args))) if on]
        if extra:
            return (f"--cuda-graph captures plain SGD at a constant --lr only; not with "
                    f"{', '.join(extra)}")
    return None


def scheduled(args):
    """Whether the rate changes over the steps (else every step runs at --lr)."""
    return args.warmup_steps > 0 or args.lr_decay != "constant"


def lr_at(step, lr, min_lr, warmup, decay_steps, decay):
    """The rate of optimizer step `step` (0-based: the steps already taken): nanoGPT's get_lr,
    a linear warmup to lr, then `decay` ("constant", "linear", "cosine") down to min_lr at
    decay_steps, min_lr after. The same function as optim/lr_schedule.cpp's lr_at."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if decay == "constant":
        return lr
    if step > decay_steps:
        return min_lr
    span = decay_steps - warmup  # 0: the decay is a step down at the warmup's end
    r = (step - warmup) / span if span > 0 else 1.0
    coeff = 1.0 - r if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * r))
    return min_lr + coeff * (lr - min_lr)


def weight_decay_groups(model, weight_decay):
    """nanoGPT's configure_optimizers groups: weight decay on the parameters of two or more dims
    (matmul weights, embeddings), none on biases and norm gains, whose decay would only pull them
    to 0. Distinct parameters in named_parameters order (a tied weight once); an empty group is
    left out, as optim/param_groups.cpp's weight_decay_groups."""
    params = [p for _, p in model.named_parameters()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(model, args):
    # SGD as it always was here. Adam/AdamW with PyTorch's default implementation, what its users
    # run: the per-tensor update on the CPU (the one ddp-bench's parity runs match bit for bit),
    # the multi-tensor (foreach) one on CUDA, which the GPU timings compare against.
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0)
    betas = (0.9, args.beta2)
    if args.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=args.lr, betas=betas, eps=1e-8)
    return torch.optim.AdamW(weight_decay_groups(model, args.weight_decay), lr=args.lr, betas=betas,
                             eps=1e-8)


def describe_recipe(args):
    """The recipe in one line, for --verbose."""
    opt = args.optimizer
    if args.optimizer != "sgd":
        decay = f", weight decay {args.weight_decay:g} on dim >= 2" if args.optimizer == "adamw" else ""
        opt += f" (betas 0.9/{args.beta2:g}, eps 1e-8{decay})"
    lr = f"lr {args.lr:g}"
    if scheduled(args):
        lr += f", {args.warmup_steps} warmup steps"
        if args.lr_decay != "constant":
            lr += f", {args.lr_decay} decay to {args.min_lr:g} at step {args.lr_decay_steps}"
    clip = f"grad clip {args.grad_clip:g}" if args.grad_clip > 0 else "no grad clip"
    return f"optimizer {opt}, {lr}, {clip}, grad accum {args.grad_accum}"
