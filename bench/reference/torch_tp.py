"""--tp N for torch_ddp.py: PyTorch's own tensor parallelism, the side ddp-bench --tp N runs
against. A (world / N, N) mesh ("dp", "tp"); torch.distributed.tensor.parallel.parallelize_module
splits the model over "tp" with the plan of models/src (Net: fc1, fc3 colwise, fc2, fc4 rowwise;
GPT blocks: c_attn colwise by heads, attn.c_proj rowwise, mlp.c_fc colwise, mlp.c_proj rowwise),
and DistributedDataParallel runs over "dp". Needs torch >= 2.2 (DeviceMesh, DTensor); Debian's
1.13 has neither, so there --tp is refused by name.

q, k and v share one Linear (c_attn). PyTorch's ColwiseParallel gives rank r one contiguous block
of its rows, which would hand rank 0 all of q and half of k; our ColwiseParallel(packed=3) splits
each of q, k, v. The same split is had here by permuting c_attn's rows before parallelize_module,
[q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], so that rank r's block is its heads of each;
the attention (zoo.py) splits its local output in three and counts heads from the tensors.
whole_params undoes the permutation, so saved parameters compare name by name with ours.
"""

import torch
import torch.distributed as dist


def unavailable():
    """None when this torch has parallelize_module and DeviceMesh, else why not."""
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
    except ImportError:
        return (f"--tp needs torch >= 2.2 (torch.distributed.tensor.parallel and DeviceMesh); "
                f"this is torch {torch.__version__}")
    return None


def plan_names(model):
    """Submodule name -> "colwise" / "rowwise", as models/src's plans."""
    names = dict(model.named_modules())
    if "h" in names:  # the zoo GPT
        plan = {}
        for i in range(len(model.h)):
            plan[f"h.{i}.attn.c_attn"] = "colwise"
            plan[f"h.{i}.attn.c_proj"] = "rowwise"
            plan[f"h.{i}.mlp.c_fc"] = "colwise"
            plan[f"h.{i}.mlp.c_proj"] = "rowwise"
        return plan
    if all(f"fc{i}" in names for i in range(1, 5)):  # Net (toy, toy8k)
        return {"fc1": "colwise", "fc2": "rowwise", "fc3": "colwise", "fc4": "rowwise"}
    return None


def _head_order(rows, tp, device):
    """The permutation [q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] of c_attn's rows."""
    d = rows // 3
    piece = d // tp
    parts = [torch.arange(c * d + r * piece, c * d + (r + 1) * piece, device=device)
             for r in range(tp) for c in range(3)]
    return torch.cat(parts)


def apply(model, tp, device_type, world):
    """Splits `model` over the tp dim of a (world / tp, tp) mesh. Returns (dp_group, dp_rank,
    state) where state is what whole_params needs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    if world % tp != 0:
        raise SystemExit(f"torch_ddp.py: --tp {tp} does not divide the world size {world}")
    plan = plan_names(model)
    if plan is None:
        raise SystemExit("torch_ddp.py: --tp: the model has no tensor-parallel plan "
                         "(toy, toy8k and the GPTs have one)")
    mesh = init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    with torch.no_grad():
        for name in plan:
            if name.endswith("c_attn"):
                lin = model.get_submodule(name)
                order = _head_order(lin.weight.shape[0], tp, lin.weight.device)
                lin.weight.copy_(lin.weight[order])
                lin.bias.copy_(lin.bias[order])
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model, mesh["tp"], {n: styles[s]() for n, s in plan.items()})
    # Which tensor dim each split parameter is split on, read before DDP sees local tensors.
    split = {}
    for name, p in model.named_parameters():
        placements = getattr(p, "placements", None)
        if placements and placements[0].is_shard():
            split[name] = placements[0].dim
    # DDP takes plain tensors: PyTorch's own bridge turns the DTensor parameters into local ones
    # (and back around each forward).
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    _pre_dp_module_transform(model)
    # Read now: that bridge's pre-forward hook puts plain DTensor attributes in place of the
    # parameters, so after a forward named_parameters() no longer lists the split ones (checked on
    # torch 2.11). These local Parameters are what DDP reduces and the optimizer steps.
    state = {"split": split, "tp_group": mesh["tp"].get_group(), "tp": tp,
             "params": list(model.named_parameters())}
    return mesh["dp"].get_group(), mesh.get_local_rank("dp"), state


def whole_params(model, state):
    """Every parameter whole, by name, c_attn's rows back in [q | k | v] order. Collective over
    the tp group."""
    out = {}
    for name, p in state["params"]:
        t = p.detach()
        dim = state["split"].get(name)
        if dim is not None:
            parts = [torch.empty_like(t) for _ in range(state["tp"])]
            dist.all_gather(parts, t.contiguous(), group=state["tp_group"])
            t = torch.cat(parts, dim=dim)
            if ".c_attn." in name:
                order = _head_order(t.shape[0], state["tp"], t.device)
                t = t[torch.argsort(order)]
        out[name] = t
    return out
