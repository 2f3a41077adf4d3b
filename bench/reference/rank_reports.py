"""What a rank of bench/reference/torch_ddp.py reports beside its step times, in ddp-bench's
fields: the bytes it holds ("memory"), its initialisation ("init_s", "init_peak_bytes"), and the
merge of the ranks' Chrome traces (--profile)."""
import json
import os
import resource
import time

import torch
import torch.distributed as dist


def memory_per_rank(net, opt, device):
    """The bytes this rank holds after the last step, as ddp-bench --json reports them (FSDP2's
    parameters are DTensors: their local shards count)."""
    def nbytes(t):  # Tensor.nbytes is torch >= 2.0
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    params = {id(p): p for p in net.parameters()}.values()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return {
        "param_bytes": sum(nbytes(p) for p in params),
        "grad_bytes": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer_state_bytes": sum(nbytes(t) for t in state if t.dim() > 0),
        "peak_gathered_bytes": -1,
        "device_peak_allocated_bytes":
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1,
    }


def init_report(start, world, rank, device):
    """Every rank's seconds from the worker's start to the wrapped model and its optimizer, and
    the process's resident high-water mark then (ru_maxrss), as ddp-bench's "init_s" and
    "init_peak_bytes" (tools/common/init_report.hpp): a sum over slots that are zero but a rank's."""
    slots = torch.zeros(2 * world, dtype=torch.int64, device=device)
    slots[2 * rank] = int((time.monotonic() - start) * 1e6)
    slots[2 * rank + 1] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if world > 1:
        dist.all_reduce(slots)
    values = slots.cpu().tolist()
    return [v / 1e6 for v in values[0::2]], values[1::2]


def merge_traces(parts, out_path):
    """Concatenates per-rank Chrome traces into one file with a process track per rank.

    Each rank's process ids are renumbered (rank * 1000 + i): torch 1.13 without Kineto writes
    the same pid ("CPU functions") in every rank's trace, and Kineto's GPU pids are device
    numbers, so the original ids would merge the ranks' tracks.
    """
    events = []
    for rank, part in enumerate(parts):
        with open(part) as f:
            trace = json.load(f)
        # Kineto writes {"traceEvents": [...], ...}; torch 1.13 without Kineto a bare list.
        rank_events = trace if isinstance(trace, list) else trace.get("traceEvents", [])
        pids = {}
        for ev in rank_events:
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue  # replaced below
            if "pid" in ev:
                ev["pid"] = pids.setdefault(ev["pid"], rank * 1000 + len(pids))
            events.append(ev)
        for original, pid in pids.items():
            name = f"rank {rank}" if len(pids) == 1 else f"rank {rank}: {original}"
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        os.remove(part)
    with open(out_path, "w") as f:
        json.dump({"traceEvents": events}, f)
