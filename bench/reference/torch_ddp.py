#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel on the models of libddp's zoo: the reference side of
docs/bench-protocol.md (side=pytorch). Same flags, models, losses and output lines as ddp-bench, so
bench/compare can run the two alternately and parse either.

    bench/reference/torch_ddp.py --ddp --nproc 2 --model toy --batch-size 32
    bench/reference/torch_ddp.py --model toy --batch-size 32              # world-1 baseline
    bench/reference/torch_ddp.py --ddp --nproc 2 --model mlp-deep \\
        --init-params init.safetensors --inputs inputs.safetensors --save-params out.safetensors

--nproc N spawns N copies of this script on loopback (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), because Debian's torchrun 1.13 does not start on Python 3.11; without --nproc the
script runs as one worker of an external launcher's job (RANK etc. from the environment, or a
world of one when there is none). Works with torch 1.13 (Gloo, CPU) and 2.x (NCCL, CUDA).

The models mirror models/src/*.cpp: the same parameter names, shapes and registration order and
the same math (checked by bench/compare --parity and tests/bench/test_reference.py). The GPT
training recipe (nanoGPT's train.py) is in the same flags as ddp-bench's: --optimizer adamw
--weight-decay --beta2, --warmup-steps --lr-decay-steps --min-lr --lr-decay, --grad-clip,
--grad-accum; their defaults are plain SGD at a constant --lr, one micro-batch, no clip. One step of
it is recipe.py's recipe_step. --optim-impl picks torch.optim's implementation (fused, foreach,
default); Adam/AdamW are fused on CUDA unless told otherwise, PyTorch's fastest there, and
torch's default (per tensor) on the CPU, which the parity runs match bit for bit. Flags this side
has no use for (e.g. --no-graph-planning, --graph-dot) are accepted and reported, never an error,
so that one command line serves both sides. --fsdp (FSDP2, with its reshard, prefetch and
mixed-precision knobs) is in torch_fsdp.py, --tp in torch_tp.py.

--cuda-graph runs the whole recipe as PyTorch documents whole-network capture (notes/cuda): DDP
built on a side stream, 11 eager recipe steps there, then one step captured with torch.cuda.graph
on that stream and replayed for every timed step. The captured step holds every micro-batch (all but the last
under DDP's no_sync), the clip (clip_grad_norm_ with foreach=True) and a capturable Adam/AdamW
whose learning rate is a 0-dim device tensor, filled before each replay, so that the schedule runs
inside the graph; bf16 autocast there runs with cache_enabled=False. SGD keeps a host lr, so with
a schedule it needs --optim-impl fused (torch 2.x's fused SGD reads a device lr). The replays read
the first batch only (--inputs' later batches are not copied in).
"""

import argparse
import contextlib
import functools
import inspect
import json
import os
import re
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402  (next to this file, not an installed package)
from local_launch import die_with_parent, free_port, spawn  # noqa: E402,F401
from recipe import (  # noqa: E402,F401
    LR_DECAYS,
    OPTIM_IMPLS,
    default_optim_impl,
    describe_recipe,
    lr_at,
    make_optimizer,
    recipe_error,
    recipe_step,
    scheduled,
    set_lr,
    weight_decay_groups,
)
from rank_reports import init_report, memory_per_rank, merge_traces  # noqa: E402
import torch_fsdp  # noqa: E402
import torch_tp  # noqa: E402

from zoo import (  # noqa: E402,F401
    FUSED_ATTENTION,
    GPT,
    MODELS,
    SHAPES,
    build_model,
    init_weights,
    loss_fn,
    random_batch,
    tie_weights_error,
)

# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch DDP reference for libddp's ddp-bench (docs/bench-protocol.md)",
        allow_abbrev=False,  # an unknown flag must never be taken for a prefix of a known one
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--toy-model", action="store_true", help="same as --model toy")
    p.add_argument("--model", choices=MODELS, default="toy")
    p.add_argument("--tie-weights", action="store_true",
                   help="GPT models: lm_head shares the token embedding's weight (wte), as in GPT-2")
    p.add_argument("--sync-bn", action="store_true",
                   help="resnet-small: SyncBatchNorm over the group (convert_sync_batchnorm); "
                        "default per-rank BatchNorm statistics")
    p.add_argument("--seq-len", type=int, default=None,
                   help="GPT and Llama models: the sequence length (default: the row's)")
    p.add_argument("--n-layer", type=int, default=None,
                   help="GPT and Llama models: the number of blocks (default: the row's)")
    p.add_argument("--n-embd", type=int, default=None,
                   help="GPT and Llama models: the width, d_model (default: the row's)")
    p.add_argument("--n-head", type=int, default=None,
                   help="GPT and Llama models: attention heads (default: the row's)")
    p.add_argument("--ddp", action="store_true", help="wrap in DistributedDataParallel")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard of the model (torch 2.x)")
    p.add_argument("--fsdp-wrap", action="store_true",
                   help="with --fsdp: fully_shard each block / layer first, then the root")
    p.add_argument("--param-dtype", choices=["fp32", "bf16", "fp16"], default=None,
                   help="with --fsdp: MixedPrecisionPolicy(param_dtype=...)")
    p.add_argument("--reduce-dtype", choices=["fp32", "bf16", "fp16"], default=None,
                   help="with --fsdp: MixedPrecisionPolicy(reduce_dtype=...)")
    p.add_argument("--reshard-after-forward", choices=list(torch_fsdp.RESHARD_AFTER_FORWARD),
                   default="default",
                   help="with --fsdp: fully_shard's reshard_after_forward. default: none passed "
                        "(FSDP2's own: blocks reshard, the root keeps its parameters); true: "
                        "every unit, the root too where this torch honours it; false: no unit "
                        "(more memory, no re-gather in backward); root-false (with --fsdp-wrap): "
                        "blocks true, root false, torchtitan's")
    p.add_argument("--fsdp-checkpoint", action="store_true",
                   help="activation checkpointing of every block or layer (any style; "
                        "apply_activation_checkpointing, non-reentrant)")
    p.add_argument("--fsdp-prefetch", type=int, default=0, metavar="N",
                   help="with --fsdp --fsdp-wrap: each block prefetches the next N blocks' "
                        "all-gathers in forward and the previous N in backward "
                        "(set_modules_to_forward_prefetch / set_modules_to_backward_prefetch); "
                        "0: FSDP2's implicit prefetch")
    p.add_argument("--dp-replicate", type=int, default=0, metavar="R",
                   help="with --fsdp: HSDP, fully_shard over the 2-D mesh (R, world / R) "
                        "(\"replicate\", \"shard\"), as ddp-bench --dp-replicate R")
    p.add_argument("--tp", type=int, default=0,
                   help="tensor parallel over N ranks of a (world / N, N) mesh, DDP over the rest "
                        "(torch >= 2.2: parallelize_module; torch_tp.py)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="per rank, per micro-batch (a step reads --batch-size x --grad-accum "
                        "samples, as ddp-bench and ddp-train)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--nproc", type=int, default=0, help="spawn N local workers")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--comm-hook", choices=["allreduce", "fp16", "bf16", "powersgd", "noop"], default="allreduce")
    p.add_argument("--autocast-bf16", action="store_true", help="forward and loss under bf16 autocast")
    p.add_argument("--json", action="store_true", help="one JSON object per result line")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--profile", action="store_true", help="write a torch.profiler Chrome trace")
    p.add_argument("--trace-file", default=None, help="trace path (default profile.json); implies --profile")
    p.add_argument("--init-params", default=None, help="safetensors file of parameters by name")
    p.add_argument("--meta-init", action="store_true",
                   help="GPT and Llama: built on the meta device, sharded (--fsdp), then "
                        "to_empty on the device and zoo.init_weights on the shards: FSDP2's "
                        "large-model path (torch >= 2.0); the constructor's distributions, not "
                        "its numbers")
    p.add_argument("--inputs", default=None, help="safetensors file of x.<step>.<rank>, y.<step>.<rank>")
    p.add_argument("--save-params", default=None, help="rank 0 writes the final parameters here")
    p.add_argument("--lr", type=float, default=0.01,
                   help="learning rate (the peak of a schedule); default optimizer SGD, momentum 0")
    # The GPT training recipe (nanoGPT's train.py), flag for flag as ddp-bench spells it.
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd",
                   help="adamw: nanoGPT's two groups (weight decay on dim >= 2 parameters only)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="adamw's decay group")
    p.add_argument("--beta2", type=float, default=0.999, help="adam/adamw betas (0.9, B)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warmup from lr / (N + 1)")
    p.add_argument("--lr-decay-steps", type=int, default=0,
                   help="the step at which the decay reaches --min-lr")
    p.add_argument("--min-lr", type=float, default=None, help="the decay's floor (default lr / 10)")
    p.add_argument("--lr-decay", choices=LR_DECAYS, default=None,
                   help="default cosine with --lr-decay-steps, else constant")
    p.add_argument("--grad-clip", type=float, default=0.0,
                   help="clip the gradients' total 2-norm to C after the all-reduce (0: off)")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="N micro-batches of --batch-size per rank per step (an --inputs batch "
                        "is split into N); all-reduce after the last")
    p.add_argument("--optim-impl", choices=OPTIM_IMPLS, default=None,
                   help="torch.optim's implementation: fused (one kernel), foreach (multi-tensor) "
                        "or default (none passed: torch's choice). Default: fused for adam/adamw "
                        "on cuda, default elsewhere")
    # Reference-only extras: PyTorch DDP's own knobs, for "best PyTorch option" runs.
    p.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
    p.add_argument("--static-graph", action="store_true", help="static_graph=True")
    p.add_argument("--find-unused-parameters", action="store_true")
    p.add_argument("--powersgd-rank", type=int, default=1, help="matrix_approximation_rank")
    p.add_argument("--powersgd-start-iter", type=int, default=10,
                   help="start_powerSGD_iter (10: ddp's default; PyTorch's own is 1000)")
    p.add_argument("--timeout-s", type=int, default=300, help="collective timeout")
    p.add_argument("--cuda-graph", action="store_true",
                   help="PyTorch's recipe (notes/cuda, DDP): DDP built on a side stream, 11 eager "
                        "steps there, then the whole recipe step (micro-batches, clip, capturable "
                        "optimizer, lr from a device tensor) captured in torch.cuda.graph and "
                        "replayed")
    args, unknown = p.parse_known_args(argv)
    if args.toy_model:
        args.model = "toy"
    if args.sync_bn and args.model != "resnet-small":
        p.error(f"--sync-bn needs a model with BatchNorm (resnet-small), got --model {args.model}")
    if args.sync_bn and args.device != "cuda":
        p.error("--sync-bn needs --device cuda: PyTorch's SyncBatchNorm runs only on GPUs")
    if args.tie_weights and tie_weights_error(args.model) is not None:
        p.error(tie_weights_error(args.model))
    if args.meta_init and (args.model not in SHAPES or args.init_params or args.tp):
        p.error("--meta-init needs a GPT or Llama model, without --init-params or --tp")
    if (args.seq_len or args.n_layer or args.n_embd or args.n_head) and args.model not in SHAPES:
        p.error("--seq-len, --n-layer, --n-embd and --n-head need a GPT or Llama model, "
                f"got --model {args.model}")
    if args.trace_file is not None:
        args.profile = True
    if args.trace_file is None:
        args.trace_file = "profile.json"
    for name in ("batch_size", "repeat", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.nproc < 0:
        p.error("--warmup and --nproc must be >= 0")
    if args.ddp and args.fsdp:
        p.error("--ddp and --fsdp are exclusive")
    if args.fsdp_wrap and not args.fsdp:
        p.error("--fsdp-wrap needs --fsdp")
    if (args.param_dtype or args.reduce_dtype) and not args.fsdp:
        p.error("--param-dtype and --reduce-dtype need --fsdp")
    if args.reshard_after_forward != "default" and not args.fsdp:
        p.error(f"--reshard-after-forward {args.reshard_after_forward} needs --fsdp")
    if args.reshard_after_forward == "root-false" and not args.fsdp_wrap:
        p.error("--reshard-after-forward root-false needs --fsdp-wrap: without it the root is the "
                "only unit (use false)")
    if args.fsdp_prefetch < 0:
        p.error(f"--fsdp-prefetch must be >= 0 (0: FSDP2's implicit prefetch), got "
                f"{args.fsdp_prefetch}")
    if args.fsdp_prefetch and not (args.fsdp and args.fsdp_wrap):
        p.error("--fsdp-prefetch needs --fsdp --fsdp-wrap: it prefetches blocks, and without "
                "--fsdp-wrap the root is the only unit")
    if args.tp < 0:
        p.error(f"--tp must be >= 1, got {args.tp}")
    if args.dp_replicate < 0 or (args.dp_replicate and not args.fsdp):
        p.error("--dp-replicate R needs --fsdp and R >= 1")
    if args.lr_decay is None:
        args.lr_decay = "cosine" if args.lr_decay_steps > 0 else "constant"
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    if args.optim_impl is None:
        args.optim_impl = default_optim_impl(args)
    why = recipe_error(args)
    if why is not None:
        p.error(why)
    if args.tp:
        if args.fsdp:
            p.error("--tp with --fsdp is not in the reference: use --tp N --ddp")
        why = torch_tp.unavailable()
        if why is not None:
            p.error(why)
    return args, unknown


# ---------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------


def load_params(model, path):
    """Copies tensors by name from a safetensors file into the model's parameters (and buffers,
    where present). Every parameter must be in the file; names the model lacks are an error."""
    tensors = safetensors_io.load_file(path)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    missing = [n for n in params if n not in tensors]
    unknown = [n for n in tensors if n not in params and n not in buffers]
    if missing or unknown:
        raise SystemExit(
            f"torch_ddp.py: --init-params {path} does not match the model: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unknown {unknown[:5]}{'...' if len(unknown) > 5 else ''}"
        )
    with torch.no_grad():
        for name, t in tensors.items():
            dst = params.get(name, buffers.get(name))
            if tuple(dst.shape) != tuple(t.shape):
                raise SystemExit(
                    f"torch_ddp.py: --init-params {path}: '{name}' has shape {list(t.shape)}, "
                    f"the model's is {list(dst.shape)}"
                )
            dst.copy_(t.to(dst.dtype))


def load_inputs(path, rank, device):
    """The per-step batches of this rank from a parity inputs file: [(x, y), ...]."""
    tensors = safetensors_io.load_file(path)
    steps = sorted(int(m.group(1)) for n in tensors if (m := re.fullmatch(r"x\.(\d+)\.0", n)))
    if steps != list(range(len(steps))) or not steps:
        raise SystemExit(f"torch_ddp.py: --inputs {path}: need x.0.0, x.1.0, ... (found steps {steps})")
    batches = []
    for s in steps:
        xn, yn = f"x.{s}.{rank}", f"y.{s}.{rank}"
        if xn not in tensors or yn not in tensors:
            raise SystemExit(f"torch_ddp.py: --inputs {path}: no {xn} / {yn} for rank {rank}")
        batches.append((tensors[xn].to(device), tensors[yn].to(device)))
    return batches


def step_batches(args, data_rank, device="cpu"):
    """This rank's step batches [(x, y), ...] and the untimed and timed step counts.

    Without --inputs: one random batch of --batch-size x --grad-accum samples, read by every step
    (--batch-size is the micro-batch, as ddp-bench's and ddp-train's). With --inputs: the file's
    batches as they are, one a step, each split into --grad-accum equal micro-batches."""
    if args.inputs:
        batches = load_inputs(args.inputs, data_rank, device)
        for x, _ in batches:
            if x.shape[0] % args.grad_accum:
                raise SystemExit(f"torch_ddp.py: --grad-accum {args.grad_accum} does not divide "
                                 f"the per-rank batch of {x.shape[0]} in --inputs {args.inputs} "
                                 f"into equal micro-batches")
        return batches, 0, len(batches)
    gen = torch.Generator().manual_seed(1000 + data_rank)
    batch = random_batch(args.model, args.batch_size * args.grad_accum, gen, device, args.seq_len)
    return [batch], args.warmup, args.repeat


def serialized(hook):
    """Runs `hook` for one bucket at a time: each call first waits for the previous bucket's future.

    PyTorch's powerSGD_hook issues its second and third collectives from future callbacks, which
    run on the backend's threads, while the next bucket's hook issues its first collective from
    the autograd thread. Over Gloo the two ranks can then issue collectives in different orders,
    and Gloo aborts ("op.preamble.length <= op.nbytes", seen here in ~1 of 3 runs of mlp-deep with
    2 buckets). Serializing buckets fixes the order at the cost of overlap between buckets.
    """
    previous = [None]

    def serialized_hook(state, bucket):
        if previous[0] is not None:
            previous[0].wait()
        previous[0] = hook(state, bucket)
        return previous[0]

    serialized_hook.__name__ = serialized_hook.__qualname__ = f"serialized_{hook.__name__}"
    return serialized_hook


def register_hook(model, args, device):
    if args.comm_hook == "allreduce":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if args.comm_hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return None
    if args.comm_hook == "noop":  # no communication: what DDP costs without it (attribution)
        from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks

        model.register_comm_hook(None, debugging_hooks.noop_hook)
        return None
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=args.powersgd_rank,
        start_powerSGD_iter=args.powersgd_start_iter,
    )
    hook = powerSGD_hook.powerSGD_hook
    model.register_comm_hook(state, serialized(hook) if device.type == "cpu" else hook)
    return state


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Under --json, stdout carries the JSON objects alone (as ddp-bench's): the worker's other lines
# go to stderr, the objects to the stdout it had.
JSON_OUT = sys.stdout


def worker(args, unknown):
    global JSON_OUT
    if args.json:
        JSON_OUT, sys.stdout = sys.stdout, sys.stderr
    start = time.monotonic()
    torch.set_num_threads(args.threads)
    distributed = args.ddp or args.fsdp or args.tp > 0
    if distributed:
        # Without a launcher (no RANK) a --ddp run is a world of one: DDP's overhead, no peers.
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
    else:
        rank, world, local_rank = 0, 1, 0
    lead = rank == 0
    if lead and unknown:
        print(f"torch_ddp.py: ignoring flags the reference has no use for: {' '.join(unknown)}",
              file=sys.stderr)

    if args.comm_hook == "bf16" and args.device == "cpu" and args.ddp:
        # Checked before any collective so that every rank leaves the same way.
        if lead:
            print("torch_ddp.py: --comm-hook bf16 is not supported on cpu: PyTorch's "
                  "bf16_compress_hook requires NCCL, and Gloo (1.13) has no bfloat16 all-reduce",
                  file=sys.stderr)
        return 2
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if distributed:
        from datetime import timedelta

        dist.init_process_group(
            backend="nccl" if args.device == "cuda" else "gloo",
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=args.timeout_s),
        )

    # The same construction on every rank (DDP broadcasts rank 0's parameters anyway).
    torch.manual_seed(1234)
    build = functools.partial(build_model, args.model, tie_weights=args.tie_weights,
                              seq_len=args.seq_len, n_layers=args.n_layer, d_model=args.n_embd,
                              n_heads=args.n_head)
    if args.meta_init:
        if not hasattr(torch.device, "__enter__"):
            raise SystemExit(f"torch_ddp.py: --meta-init needs torch >= 2.0 (the meta device as "
                             f"a context); this is torch {torch.__version__}")
        with torch.device("meta"):
            model = build()
    else:
        model = build()
    if args.init_params:
        load_params(model, args.init_params)
    if args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if not args.meta_init:
        model.to(device)
    elif not args.fsdp:  # materialised whole before DDP (its broadcast needs values)
        model.to_empty(device=device)
        init_weights(model)
    if args.fsdp_checkpoint:
        torch_fsdp.checkpoint_blocks(model)
    net = model  # what named_parameters() is read from at the end
    dp_group, data_rank, tp_state = None, rank, None
    if args.tp:
        if world > args.tp and not args.ddp:
            raise SystemExit(f"torch_ddp.py: --tp {args.tp} at world {world} needs --ddp over the "
                             f"dp dim")
        # The ranks of one tp group read the same batch: their dp coordinate's.
        dp_group, data_rank, tp_state = torch_tp.apply(model, args.tp, device.type, world)
    if args.cuda_graph and args.device != "cuda":
        raise SystemExit("torch_ddp.py: --cuda-graph needs --device cuda")
    # --cuda-graph: the recipe builds DDP and runs its warm-up on a side stream.
    graph_stream = torch.cuda.Stream(device) if args.cuda_graph else None
    if graph_stream is not None:
        graph_stream.wait_stream(torch.cuda.current_stream(device))
    side = torch.cuda.stream(graph_stream) if graph_stream is not None else contextlib.nullcontext()
    if args.ddp:
        side.__enter__()
        if args.first_bucket_cap_mb != 1.0:
            # DDP reads the first bucket's cap from this module attribute at construction (1.13 and
            # 2.x alike); there is no constructor argument for it.
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.first_bucket_cap_mb * 1024 * 1024)
        kwargs = {}
        if args.bucket_cap_mb != 25.0:
            # Only when asked: torch 2.x treats an explicit bucket_cap_mb differently from its
            # default (None) when building the first buckets.
            kwargs["bucket_cap_mb"] = args.bucket_cap_mb
        model = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[local_rank] if device.type == "cuda" else None,
            gradient_as_bucket_view=args.bucket_view,
            static_graph=args.static_graph,
            find_unused_parameters=args.find_unused_parameters,
            process_group=dp_group,
            **kwargs,
        )
        register_hook(model, args, device)
        side.__exit__(None, None, None)
    elif args.fsdp:
        model = torch_fsdp.make_fsdp(model, args)
        if args.meta_init:  # each rank's shards materialised, then initialised
            model.to_empty(device=device)
            init_weights(net)
    model.train()
    lossf = loss_fn(args.model)
    opt = make_optimizer(model, args, device)
    init_s, init_peak_bytes = init_report(start, world, rank, device)

    batches, warmup, repeat = step_batches(args, data_rank, device)
    accum = args.grad_accum

    if lead and args.verbose:
        n = sum(p.numel() for p in net.parameters())
        gpt = ""  # which attention ran, and the tie: what a GPT timing depends on
        if isinstance(net, GPT):
            gpt = f", attention {'fused' if FUSED_ATTENTION else 'written out'}"
            gpt += ", tied wte/lm_head" if args.tie_weights else ""
        print(f"torch_ddp.py: torch {torch.__version__}, model {args.model}, {n} parameters in "
              f"{len(list(net.parameters()))} tensors, world {world}, device {device}, "
              f"{'DDP' if args.ddp else torch_fsdp.describe(args) if args.fsdp else 'plain'}, "
              f"comm hook {args.comm_hook}"
              f"{gpt}")
        print(f"torch_ddp.py: {describe_recipe(args)}")

    autocast = (
        (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16))
        if args.autocast_bf16
        else contextlib.nullcontext
    )

    def grad_sync(last):
        """Micro-batches before the last only accumulate: no all-reduce until the last one's
        backward (DDP's no_sync; FSDP2's reduce-scatter switch where this torch has it)."""
        if args.fsdp and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        elif args.ddp and not last:
            return model.no_sync()
        return contextlib.nullcontext()

    # clip_grad_norm_'s multi-tensor kernels on CUDA (the keyword is torch >= 2.0's).
    clip_foreach = (device.type == "cuda"
                    and "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters)

    def recipe(x, y, autocast):
        return recipe_step(model, opt, lossf, x, y, accum=accum, grad_clip=args.grad_clip,
                           grad_sync=grad_sync, autocast=autocast, clip_foreach=clip_foreach)

    taken = [0]  # optimizer steps so far: the schedule's step (every warm-up step counts too)

    def schedule():
        """Sets the learning rate of step taken[0] (a device write under --cuda-graph)."""
        set_lr(opt, lr_at(taken[0], args.lr, args.min_lr, args.warmup_steps, args.lr_decay_steps,
                          args.lr_decay))

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        schedule()
        loss = recipe(x, y, autocast)
        taken[0] += 1
        return loss

    graph = None  # --cuda-graph: the captured step, replayed by step()
    if args.cuda_graph:
        # PyTorch's whole-network recipe (notes/cuda, "Whole-network capture" and DDP):
        #
        #   graph_stream: DDP built | 11 eager recipe steps (new buffers, optimizer state, DDP's
        #                 bucket rebuild, NCCL's lazy connect) | grads set to None, one recipe
        #                 step captured (its gradients allocated in the graph's pool)
        #   timed steps:  lr tensor filled (outside the graph) | graph.replay()
        #
        # Autocast caching must be off in a captured region (PyTorch's documented constraint): a
        # cached cast made at capture would be replayed as a stale tensor.
        captured_autocast = (
            (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16, cache_enabled=False))
            if args.autocast_bf16
            else contextlib.nullcontext
        )
        x0, y0 = batches[0]
        # The batch, the optimizer's lr tensor and the parameters were made on the current stream.
        graph_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(graph_stream):
            for _ in range(11):
                opt.zero_grad(set_to_none=True)
                schedule()
                recipe(x0, y0, captured_autocast)
                taken[0] += 1
        torch.cuda.current_stream(device).wait_stream(graph_stream)
        graph = torch.cuda.CUDAGraph()
        # None before the capture: the captured backward allocates the gradients in the graph's
        # pool, and every replay writes them afresh (the step's first micro-batch overwrites).
        opt.zero_grad(set_to_none=True)
        # Captured on graph_stream, where DDP was built and the warm-up ran: each AccumulateGrad
        # node keeps the stream of its first use (DDP holds the nodes), and on graph's own side
        # stream torch 2.11 warns of the mismatch and forks every gradient's accumulation to it.
        with torch.cuda.graph(graph, stream=graph_stream):
            static_loss = recipe(x0, y0, captured_autocast)

        def step(i):  # noqa: F811 (the captured step replaces the eager one)
            schedule()  # read by the replay: the lr tensor is in the graph, its value is not
            graph.replay()
            taken[0] += 1
            return static_loss

    for i in range(warmup):
        step(i)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # peaks of the timed steps, as ddp-bench
    if distributed:
        dist.barrier()

    prof = None
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        prof.__enter__()
    times_ms = []
    for i in range(repeat):
        t0 = time.perf_counter()
        step(i)
        sync(device)
        times_ms.append((time.perf_counter() - t0) * 1e3)
    if prof is not None:
        prof.__exit__(None, None, None)
        part = f"{args.trace_file}.rank{rank}.part" if world > 1 else args.trace_file
        prof.export_chrome_trace(part)
        if world > 1:
            dist.barrier()
            if lead:
                merge_traces([f"{args.trace_file}.rank{r}.part" for r in range(world)], args.trace_file)
        if lead:
            print(f"torch_ddp.py: wrote Chrome trace {args.trace_file} (torch.profiler, one process "
                  f"track per rank)", file=sys.stderr)

    if args.save_params:
        if args.fsdp:
            raise SystemExit("torch_ddp.py: --save-params with --fsdp is not supported")
        params = (torch_tp.whole_params(net, tp_state) if tp_state is not None
                  else {torch_fsdp.unwrapped_name(n): p.detach() for n, p in net.named_parameters()})
        if lead:
            safetensors_io.save_file(params, args.save_params)

    if lead:
        median = statistics.median(times_ms)
        mean = statistics.fmean(times_ms)
        fields = {
            "model": args.model,
            "world": world,
            # The micro-batch per rank, as ddp-bench's "batch" (a step reads grad_accum of them).
            "batch": (args.batch_size if not args.inputs
                      else int(batches[0][0].shape[0]) // args.grad_accum),
            "device": args.device,
            "side": "pytorch",
            "median_ms": round(median, 3),
            "mean_ms": round(mean, 3),
            "min_ms": round(min(times_ms), 3),
            "repeat": repeat,
            "init_s": [round(v, 3) for v in init_s],
            "init_peak_bytes": init_peak_bytes,
            "memory": memory_per_rank(net, opt, device),
        }
        if args.json:
            print(json.dumps(fields, separators=(",", ":")), file=JSON_OUT, flush=True)
        else:
            for key in ("memory", "init_s", "init_peak_bytes"):
                fields.pop(key)
            print("result " + " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items()))
        if args.verbose and args.ddp:
            data = model._get_ddp_logging_data()
            keep = ("bucket_sizes", "num_buckets_reduced", "rebuilt_bucket_sizes", "comm_hook",
                    "avg_forward_compute_time", "avg_backward_compute_time",
                    "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time")
            for k in keep:
                if k in data:
                    print(f"  ddp {k}: {data[k]}")
        if args.verbose and args.fsdp:
            print(f"torch_ddp.py: {torch_fsdp.fsdp_as_run(model) or 'FSDP2 as run: not readable'}")
        print(f"mean latency {mean:.3f} ms across {repeat} runs", flush=True)

    if graph is not None:
        # A graph holding NCCL work must go before its process group (pytorch/pytorch#115388):
        # with it alive, world-2 runs hung at their end here (torch 2.11, H200), after the result.
        sync(device)
        graph.reset()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main(argv):
    args, unknown = parse_args(argv)
    is_worker = os.environ.get("TORCH_DDP_REFERENCE_WORKER") == "1"
    if not is_worker and args.nproc > 0 and (args.ddp or args.fsdp or args.tp):
        return spawn(os.path.abspath(__file__), args.nproc, argv)
    if not is_worker and args.nproc > 1:
        print("torch_ddp.py: --nproc without --ddp/--fsdp: running the plain model in one process "
              "(the world-1 baseline)", file=sys.stderr)
    return worker(args, unknown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
