"""The GPT training recipe (nanoGPT's train.py) on PyTorch's side of the comparisons: the checks
of its flags, the learning-rate schedule, AdamW's weight-decay groups, the optimizer and one
optimizer step (recipe_step), as torch_ddp.py runs them eagerly and inside a CUDA graph. The C++
side: tools/common/recipe_flags.cpp, optim/lr_schedule.cpp, optim/param_groups.cpp
(docs/training.md)."""

import contextlib
import inspect
import math
import re

import torch


LR_DECAYS = ("constant", "linear", "cosine")
# --optim-impl: torch.optim's three implementations of one update. fused: one kernel for all
# tensors (fused=True); foreach: multi-tensor kernels (foreach=True); default: none passed, torch's
# own choice (foreach on CUDA, per tensor on the CPU: the one ddp-bench's CPU parity runs match).
OPTIM_IMPLS = ("fused", "foreach", "default")


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
    why = optim_impl_error(args)
    if why is not None:
        return why
    if args.cuda_graph and args.optimizer == "sgd" and scheduled(args) and args.optim_impl != "fused":
        # Adam/AdamW (capturable, fused or foreach) read a device-tensor lr inside their kernels;
        # torch's foreach and per-tensor SGD pass it as alpha=-lr, a host number, which would bake
        # one rate into the graph (or sync the host mid-capture). Fused SGD reads it on the device.
        return (f"--cuda-graph with an lr schedule and --optimizer sgd needs --optim-impl fused: "
                f"torch's {args.optim_impl} SGD reads the learning rate on the host, so a captured "
                f"step would replay one rate (use adam/adamw, or a constant --lr)")
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


OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def _torch_at_least(major, minor):
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) >= (major, minor)


def _takes(cls, kwarg):
    """Whether this torch's optimizer class has the keyword (fused: Adam from 1.13, AdamW from 2.0,
    SGD later in 2.x)."""
    return kwarg in inspect.signature(cls.__init__).parameters


def default_optim_impl(args):
    """--optim-impl when none is given: fused Adam/AdamW on CUDA, PyTorch's fastest update there
    (one kernel for every tensor), where this torch has it; elsewhere torch's own choice, as
    before (the CPU parity runs match ddp-bench's per-tensor update bit for bit)."""
    if (args.device == "cuda" and args.optimizer in ("adam", "adamw")
            and _takes(OPTIMIZERS[args.optimizer], "fused")):
        return "fused"
    return "default"


def optim_impl_error(args):
    """Why --optim-impl cannot run with this optimizer, device and torch (None when it can)."""
    cls = OPTIMIZERS[args.optimizer]
    if args.optim_impl == "fused" and args.device == "cpu" and not _torch_at_least(2, 4):
        return (f"--optim-impl fused needs --device cuda with torch {torch.__version__}: its fused "
                f"optimizers are CUDA kernels (the CPU ones came in torch 2.4); use --optim-impl "
                f"foreach or default")
    if args.optim_impl in ("fused", "foreach") and not _takes(cls, args.optim_impl):
        return (f"--optim-impl {args.optim_impl}: torch {torch.__version__}'s {cls.__name__} has "
                f"no {args.optim_impl} implementation; use --optim-impl default")
    return None


def device_lr(args):
    """Whether the learning rate is a 0-dim device tensor (set_lr fills it before each replay):
    under --cuda-graph wherever the optimizer reads it on the device, Adam/AdamW always, SGD where
    a schedule needs it (fused only: see recipe_error); a constant SGD rate is baked in."""
    return args.cuda_graph and (args.optimizer != "sgd" or scheduled(args))


def make_optimizer(model, args, device=None):
    """The recipe's optimizer. SGD at momentum 0, as always here; Adam/AdamW (betas 0.9/--beta2,
    eps 1e-8; AdamW in weight_decay_groups) in the --optim-impl implementation.

    --cuda-graph (PyTorch's capturable recipe): Adam/AdamW get capturable=True (the step count and
    bias corrections live on the device, not baked into the graph as host numbers), and the
    learning rate is a 0-dim tensor on `device` where device_lr says so."""
    cls = OPTIMIZERS[args.optimizer]
    kwargs = {}
    if args.optim_impl != "default":
        kwargs[args.optim_impl] = True
    lr = torch.tensor(args.lr, device=device) if device_lr(args) else args.lr
    if args.optimizer == "sgd":
        return cls(model.parameters(), lr=lr, momentum=0, **kwargs)
    if args.cuda_graph:
        kwargs["capturable"] = True
    betas = (0.9, args.beta2)
    params = (model.parameters() if args.optimizer == "adam"
              else weight_decay_groups(model, args.weight_decay))
    return cls(params, lr=lr, betas=betas, eps=1e-8, **kwargs)


def set_lr(opt, rate):
    """Sets every group's learning rate to `rate`. A tensor rate (--cuda-graph) is filled in place,
    one small device write per tensor outside the graph, which the next replay reads; the groups
    of one optimizer share the tensor given at construction, so it is written once."""
    filled = set()
    for group in opt.param_groups:
        lr = group["lr"]
        if torch.is_tensor(lr):
            if id(lr) not in filled:
                lr.fill_(rate)
                filled.add(id(lr))
        else:
            group["lr"] = rate


def recipe_step(model, opt, lossf, x, y, accum=1, grad_clip=0.0, grad_sync=None,
                autocast=contextlib.nullcontext, clip_foreach=False):
    """One optimizer step of the recipe on the step's batch (x, y) of accum x --batch-size samples,
    as the eager step and the captured one run it: `accum` micro-batches (x and y chunked along dim
    0), each loss divided by accum, all but the last under grad_sync(False) (DDP's no_sync), the
    last under grad_sync(True); the gradients' total 2-norm clipped to grad_clip (0: off);
    opt.step(). Returns the batch's loss (a tensor: nothing here reads the device from the host,
    so the step can be captured).

    The caller zeroes (or frees) the gradients first and sets the learning rate (set_lr); the
    micro-batches' gradients add up from there. Inside a capture (torch.cuda.graph) the gradients
    must be None at its start: the first backward then allocates them in the graph's pool and every
    replay overwrites them, PyTorch's whole-network recipe. clip_foreach: clip_grad_norm_'s
    multi-tensor kernels (CUDA; torch >= 2.0 takes the keyword)."""
    rf = torch.autograd.profiler.record_function
    sync = grad_sync or (lambda last: contextlib.nullcontext())
    if accum == 1:  # one micro-batch: synchronized as it always is, grad_sync not consulted
        with rf("forward"), autocast():
            loss = lossf(model(x), y)
        with rf("backward"):
            loss.backward()
    else:
        losses = []
        for k, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
            with sync(k == accum - 1):
                with rf("forward"), autocast():
                    micro = lossf(model(xm), ym)
                with rf("backward"):
                    # Each micro loss is a mean over 1/accum of the batch: the accumulated
                    # gradient is then the whole batch's mean, as without accumulation.
                    (micro / accum).backward()
            losses.append(micro.detach())
        loss = torch.stack(losses).mean()
    if grad_clip > 0:
        with rf("clip"):
            kwargs = {"foreach": True} if clip_foreach else {}
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, **kwargs)
    with rf("optimizer"):
        opt.step()
    return loss


def describe_recipe(args):
    """The recipe in one line, for --verbose."""
    opt = f"{args.optimizer} ({args.optim_impl}"
    if args.optimizer == "sgd":
        opt += ", momentum 0"
    else:
        capturable = ", capturable" if args.cuda_graph else ""
        decay = f", weight decay {args.weight_decay:g} on dim >= 2" if args.optimizer == "adamw" else ""
        opt += f"{capturable}, betas 0.9/{args.beta2:g}, eps 1e-8{decay}"
    opt += ")"
    lr = f"lr {args.lr:g}"
    if device_lr(args):
        lr += " (a device tensor, set before each replay)"
    if scheduled(args):
        lr += f", {args.warmup_steps} warmup steps"
        if args.lr_decay != "constant":
            lr += f", {args.lr_decay} decay to {args.min_lr:g} at step {args.lr_decay_steps}"
    clip = f"grad clip {args.grad_clip:g}" if args.grad_clip > 0 else "no grad clip"
    return f"optimizer {opt}, {lr}, {clip}, grad accum {args.grad_accum}"
