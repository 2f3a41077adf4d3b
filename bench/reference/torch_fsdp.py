"""--fsdp for torch_ddp.py: PyTorch's FSDP2 (fully_shard), the side ddp-bench --fsdp runs against,
with FSDP2's documented knobs so that a run can face its best configuration, not only its default:

    --fsdp-wrap                    fully_shard each block / layer first, then the root
    --reshard-after-forward MODE   fully_shard(reshard_after_forward=...), blocks and root apart
    --fsdp-prefetch N              set_modules_to_forward_prefetch / _backward_prefetch, N deep
    --param-dtype, --reduce-dtype  MixedPrecisionPolicy
    --fsdp-checkpoint              activation checkpointing per block (any style, as ddp-bench's)

Needs FSDP2 (torch >= 2.4: torch.distributed.fsdp from 2.6, torch.distributed._composable.fsdp
before); Debian's 1.13 has none, so there --fsdp is refused at the start of the run.

[Note: the root and reshard_after_forward] FSDP2 does not reshard the root after forward when it
was not told to: the root's parameters (embeddings, final norm, head) are needed again at once by
backward, so freeing them would cost one all-gather for nothing. Older FSDP2 (its lazy init sets the
root's post_forward_mesh_info to None unconditionally) keeps the root gathered even when given
reshard_after_forward=True; newer FSDP2 (reshard_after_forward=None by default, "False for the
root") honours an explicit True. So MODE "default" (nothing passed) and "root-false" (True for
the blocks, False for the root: torchtitan's setting) run the same schedule on every FSDP2, and
"true" differs from them only where the torch honours it; fsdp_as_run() reads back what ran.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from zoo import GPT, Llama, ResNetSmall

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# --reshard-after-forward MODE -> (the blocks', the root's) reshard_after_forward; None: pass
# nothing, FSDP2's own default. See [Note: the root and reshard_after_forward].
RESHARD_AFTER_FORWARD = {
    "default": (None, None),     # today's runs: blocks reshard, the root stays gathered
    "true": (True, True),        # every unit, the root too where this torch honours it
    "false": (False, False),     # nothing resharded between forward and backward: no re-gather
    "root-false": (True, False),  # torchtitan's: the blocks reshard, the root does not
}


def describe(args):
    """The FSDP2 configuration in words, for the verbose line that says what runs."""
    mode = args.reshard_after_forward
    blocks, root = RESHARD_AFTER_FORWARD[mode]
    if blocks is None:
        reshard = "FSDP2's default"
    elif args.fsdp_wrap:
        reshard = f"{mode} (blocks {str(blocks).lower()}, root {str(root).lower()})"
    else:
        reshard = mode
    prefetch = (f"explicit, {args.fsdp_prefetch} blocks ahead in forward and behind in backward"
                if args.fsdp_prefetch else "implicit")
    if args.param_dtype or args.reduce_dtype:
        mp = (f"MixedPrecisionPolicy(param {args.param_dtype or 'as stored'}, reduce "
              f"{args.reduce_dtype or args.param_dtype or 'as stored'})")
    else:
        mp = "no MixedPrecisionPolicy"
    hsdp = (f", HSDP: {args.dp_replicate} replicas" if getattr(args, "dp_replicate", 0) > 1
            else "")
    return (f"FSDP2 ({'a unit per block, then the root' if args.fsdp_wrap else 'the root alone'}{hsdp}, "
            f"reshard after forward {reshard}, prefetch {prefetch}, {mp})")


def prefetch_plan(n_units, n):
    """FSDP2's documented explicit prefetching (pytorch/examples distributed/FSDP2): unit i
    prefetches units i+1 .. i+n in forward and i-1 .. i-n in backward (nearest first). Returns
    ({unit: [units]} forward, {unit: [units]} backward); a unit without a list keeps FSDP2's
    implicit prefetch. The example stops n units short of each end instead of cutting the lists;
    its all-gathers are the same (the units it leaves out were already listed by an earlier one),
    and cut lists keep an n past the number of blocks from silently prefetching nothing."""
    forward = {i: list(range(i + 1, min(i + n, n_units - 1) + 1)) for i in range(n_units)}
    backward = {i: list(range(i - 1, max(i - n, 0) - 1, -1)) for i in range(n_units)}
    return ({i: v for i, v in forward.items() if v}, {i: v for i, v in backward.items() if v})


def blocks_of(model):
    """The blocks or layers, in forward order: GPT blocks, Llama layers, ResNet blocks, the Linears
    of Net/MLP (registered in forward order, as in models/src)."""
    if isinstance(model, GPT):
        return list(model.h)
    if isinstance(model, Llama):
        return list(model.layers)
    if isinstance(model, ResNetSmall):
        return [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def units_of(model):
    """What --fsdp-wrap shards one by one, in forward order, as models/src/registry.cpp's wrap
    units: the blocks, and an untied Llama's tok_embeddings and output around them (torchtitan's
    wrapping; tied, they share one weight and stay in the root)."""
    blocks = blocks_of(model)
    if isinstance(model, Llama) and model.output.weight is not model.tok_embeddings.weight:
        return [model.tok_embeddings] + blocks + [model.output]
    return blocks


def checkpoint_blocks(model):
    """--fsdp-checkpoint: activation checkpointing of every block or layer (blocks_of), as
    torchtitan's full AC and ddp-bench's flag: each is replaced, in place, by a non-reentrant
    CheckpointWrapper before DDP or fully_shard (each FSDP2 unit is then the wrapper around its
    block). That is what apply_activation_checkpointing does; it is done here directly because
    that function imports FSDP, which torch 1.13 cannot import under Python 3.11, and the wrapper
    serves --ddp on the CPU too. Returns how many blocks were wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    blocks = set(blocks_of(model))
    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child in blocks:
                setattr(parent, name,
                        checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
                wrapped += 1
    return wrapped


def unwrapped_name(name):
    """A parameter's name as the model without --fsdp-checkpoint has it (the wrapper adds a level),
    so that --save-params files compare by name with ddp-bench's."""
    return name.replace("_checkpoint_wrapped_module.", "")


def _refuse(message):
    """Leaves the run with status 2, saying why once (rank 0); every rank takes this branch."""
    if dist.get_rank() == 0:
        print(f"torch_ddp.py: {message}", file=sys.stderr)
    sys.exit(2)


def make_fsdp(model, args):
    """FSDP2 on the model under args' --fsdp-wrap, --reshard-after-forward, --fsdp-prefetch,
    --param-dtype and --reduce-dtype; without --fsdp-wrap the root alone (one unit, as ddp-bench
    --fsdp without --fsdp-wrap)."""
    fully_shard = None
    # Any exception, not only ImportError: torch 1.13's fsdp package raises ValueError on import
    # under Python 3.11 (a dataclass with a mutable default).
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch >= 2.6
    except Exception:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # 2.4-2.5
        except Exception:
            pass
    if fully_shard is None:
        _refuse(f"--fsdp needs FSDP2 (torch >= 2.4); this is torch {torch.__version__}")
    kwargs = {}
    replicas = getattr(args, "dp_replicate", 0)
    if replicas > 1 or (args.device == "cpu" and torch.cuda.is_available()):
        # HSDP: shard within (world / R) ranks, replicate across R (FSDP2's 2-D mesh). On the CPU
        # of a machine with CUDA the mesh is given too: FSDP2's default takes CUDA's device type
        # wherever CUDA exists.
        from torch.distributed.device_mesh import init_device_mesh
        world = dist.get_world_size()
        if replicas > 1 and world % replicas:
            _refuse(f"--dp-replicate {replicas} does not divide the world size {world}")
        shape, names = (((replicas, world // replicas), ("replicate", "shard")) if replicas > 1
                        else ((world,), ("shard",)))
        kwargs["mesh"] = init_device_mesh(args.device, shape, mesh_dim_names=names)
    if args.param_dtype or args.reduce_dtype:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=DTYPES.get(args.param_dtype),
                                                   reduce_dtype=DTYPES.get(args.reduce_dtype))

    def reshard(value):  # None: leave reshard_after_forward to FSDP2
        return {} if value is None else {"reshard_after_forward": value}

    blocks_reshard, root_reshard = RESHARD_AFTER_FORWARD[args.reshard_after_forward]
    units = units_of(model) if args.fsdp_wrap else []
    for unit in units:
        fully_shard(unit, **kwargs, **reshard(blocks_reshard))
    fully_shard(model, **kwargs, **reshard(root_reshard))
    if args.fsdp_prefetch:
        if not hasattr(model, "set_modules_to_forward_prefetch"):
            _refuse(f"--fsdp-prefetch needs FSDPModule.set_modules_to_forward_prefetch, which "
                    f"torch {torch.__version__} lacks")
        forward, backward = prefetch_plan(len(units), args.fsdp_prefetch)
        for i, later in forward.items():
            units[i].set_modules_to_forward_prefetch([units[j] for j in later])
        for i, earlier in backward.items():
            units[i].set_modules_to_backward_prefetch([units[j] for j in earlier])
    return model


def fsdp_as_run(model):
    """After the steps: how many blocks and whether the root resharded after forward, read from
    FSDP2's private state (the root's is settled only by the first forward's lazy init; see
    [Note: the root and reshard_after_forward]). None where this torch's state does not say."""
    def reshards(module):
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
        groups = [g for g in groups if g is not None]
        return any(g.post_forward_mesh_info is not None for g in groups) if groups else None

    try:
        blocks = [reshards(m) for m in model.modules()
                  if m is not model and hasattr(m, "_get_fsdp_state")]
        root = reshards(model)
    except Exception:  # private state: absent or renamed in this torch
        return None
    if None in blocks:
        return None
    root = ("the root holds no parameters of its own" if root is None
            else "the root resharded" if root else "the root kept its parameters")
    return f"FSDP2 as run: {sum(blocks)} of {len(blocks)} blocks resharded after forward, {root}"
