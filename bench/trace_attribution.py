#!/usr/bin/env python3
"""Where a step's communication goes, read from a kernel trace (Kineto's Chrome trace JSON, as
`ddp-bench --kernel-trace FILE` and torch.profiler write it).

Every GPU kernel in the trace is tied to the host call that launched it (the `correlation` of its
launch); the host's calls split the kernels into steps: each `cudaGraphLaunch` of a captured step,
else the device synchronizations the benchmark makes between eager steps. Per step it prints:

  compute   the union of the non-NCCL kernels' intervals (the compute stream's busy time), and
            the median host time between two compute kernels' launches
  nccl      the NCCL kernels (one per bucket for DDP): their sum, the part that ran while some
            compute kernel ran (hidden) and the rest (exposed: the step waits for it)
  tail      from the end of backward's last compute kernel (the last one that starts before the
            last NCCL kernel ends) to the end of the last NCCL kernel: what the step waits for
and per NCCL kernel (bucket b in launch order): its host launch, GPU start and end, relative to the
end of backward's last compute kernel (negative: before it), its duration and its hidden part.

The idle gaps: every stretch of the step in which no compute kernel runs, each named by the kernels
on either side of it and by why the next compute kernel had not started:
  host      it was launched after the gap began (the device waited for the host)
  nccl      it was launched earlier, and an NCCL kernel ran in the gap (the compute stream waited
            for a collective: exposed communication)
  waiting   it was launched earlier and nothing ran (a stream wait, an event, the device's queue)
With --baseline ONE_GPU_TRACE (the same model on one GPU, no DDP) it also prints the compute
kernels' time by class (gemm, attention, elementwise, ...), this step against the baseline's: what
the collectives running beside them cost each class.

  bench/trace_attribution.py TRACE [--step K] [--baseline TRACE] [--svg OUT.svg]

--step picks the step (default: the middle one of those traced); --svg draws it, one lane per
stream. Uses only the standard library.
"""
import argparse
import bisect
import json
import re
import sys
from xml.sax.saxutils import escape

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def is_nccl(event):
    return event["name"].lower().startswith("nccl")


# Compute kernels by what they do, first match wins (names as CUPTI reports them: cuBLAS/CUTLASS
# GEMMs, cuDNN/flash attention, ATen's elementwise and reduction templates, the optimizers' foreach
# kernels).
KERNEL_CLASSES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|matmul", re.I)),
    ("layernorm", re.compile(r"layer_?norm", re.I)),
    ("loss", re.compile(r"softmax|cross_entropy|nll_loss", re.I)),
    ("embedding", re.compile(r"embedding|index|scatter|gather", re.I)),
    # A multi-tensor copy: DDP's gradients staged into their buckets (BucketStorage::fill).
    ("foreach copy", re.compile(r"multi_tensor_apply.*Copy<", re.I)),
    ("optimizer", re.compile(r"foreach|multi_tensor|sgd|adam", re.I)),
    ("reduction", re.compile(r"reduce", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
    ("copy", re.compile(r"memcpy", re.I)),
    ("memset", re.compile(r"memset", re.I)),
)


def kernel_class(name):
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def short(name, width=48):
    """A kernel's name cut to `width` characters, its template arguments dropped."""
    name = re.sub(r"<.*", "", name.replace("void ", "")).strip()
    return name[:width]


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def covered(start, end, merged):
    """How much of [start, end) the merged intervals cover."""
    total = 0.0
    for s, e in merged:
        if e <= start:
            continue
        if s >= end:
            break
        total += min(e, end) - max(s, start)
    return total


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def steps_of(events):
    """(step start times on the host, kind): graph launches of a captured step, else the ends of
    the device synchronizations the benchmark makes between eager steps."""
    launches = sorted(e["ts"] for e in events if e.get("cat") == "cuda_runtime"
                      and "GraphLaunch" in e["name"])
    if launches:
        return launches, "captured"
    syncs = sorted(e["ts"] + e["dur"] for e in events if e.get("cat") == "cuda_runtime"
                   and e["name"] in ("cudaDeviceSynchronize", "cudaStreamSynchronize"))
    if syncs:
        return [float("-inf")] + syncs, "eager"
    return [], "none"


def analyze(events, step_index=None):
    launch_ts = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                launch_ts[corr] = e["ts"]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    starts, kind = steps_of(events)
    if not starts or not gpu:
        raise SystemExit("trace_attribution: no steps or no GPU kernels in this trace")
    by_step = [[] for _ in starts]
    for e in gpu:
        t = launch_ts.get(e.get("args", {}).get("correlation"))
        if t is None:
            continue
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0:
            by_step[k].append((e, t))
    if step_index is None:
        # The middle of the steps that hold kernels (a leading mark may precede the first step).
        # Segments between synchronizations that hold a step's worth of kernels (a loss read
        # between steps makes small ones).
        most = max(len(ks) for ks in by_step)
        with_kernels = [k for k, ks in enumerate(by_step) if ks and len(ks) * 2 >= most]
        step_index = with_kernels[len(with_kernels) // 2] if with_kernels else 0
    kernels = sorted(by_step[step_index], key=lambda et: et[0]["ts"])
    if not kernels:
        raise SystemExit(f"trace_attribution: step {step_index} has no kernels")
    compute = [(e, t) for e, t in kernels if not is_nccl(e)]
    nccl = [(e, t) for e, t in kernels if is_nccl(e)]
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e, _ in compute])
    # The end of backward: the last compute kernel that starts before the last NCCL kernel ends
    # (the optimizer's kernels wait for the reduced gradients, so they start after it).
    last_nccl_end = max((e["ts"] + e["dur"] for e, _ in nccl), default=None)
    before = [e["ts"] + e["dur"] for e, _ in compute
              if last_nccl_end is None or e["ts"] < last_nccl_end]
    ref = max(before) if before else kernels[0][0]["ts"]
    step_start = kernels[0][0]["ts"]
    step_end = max(e["ts"] + e["dur"] for e, _ in kernels)
    rows = []
    for b, (e, t) in enumerate(nccl):
        s, d = e["ts"], e["dur"]
        rows.append({"bucket": b, "launch_ms": (t - ref) / 1e3, "start_ms": (s - ref) / 1e3,
                     "end_ms": (s + d - ref) / 1e3, "dur_ms": d / 1e3,
                     "hidden_ms": covered(s, s + d, busy) / 1e3, "name": e["name"][:40]})
    gaps = idle_gaps(compute, nccl, step_end)
    nccl_total = sum(r["dur_ms"] for r in rows)
    hidden = sum(r["hidden_ms"] for r in rows)
    last_end = max((r["end_ms"] for r in rows), default=0.0)
    summary = {"kind": kind, "step": step_index, "steps": len(starts),
               "step_gpu_ms": (step_end - step_start) / 1e3,
               "compute_busy_ms": sum(e - s for s, e in busy) / 1e3,
               "compute_kernels": len(compute), "nccl_kernels": len(nccl),
               "nccl_ms": nccl_total, "nccl_hidden_ms": hidden, "nccl_exposed_ms": nccl_total - hidden,
               "tail_after_backward_ms": max(0.0, last_end),
               "backward_end_ms": (ref - step_start) / 1e3,
               "host_launch_interval_us": launch_interval(compute)}
    for why in GAP_CAUSES:
        summary[f"gaps_{why}_ms"] = sum(g["ms"] for g in gaps if g["why"] == why)
    summary["gaps"] = gaps
    summary["classes"] = class_times(compute)
    return summary, rows, kernels, ref


GAP_CAUSES = ("host", "nccl", "waiting")


def launch_interval(compute):
    """The median time on the host between two consecutive compute kernels' launches (us): how
    fast the host issues the step's work (issue 44, gpt2-medium: 23.1 us at world 4 against 17.3 at
    world 1 over the whole step, 26.5 against 14.0 in the forward alone, where the GPU waited for
    the host)."""
    launches = sorted(t for _, t in compute)
    steps = sorted(b - a for a, b in zip(launches, launches[1:]))
    return steps[len(steps) // 2] if steps else 0.0


def idle_gaps(compute, nccl, step_end):
    """The stretches of the step with no compute kernel running, in time order, each with the
    kernels on either side and why the next compute kernel had not started (GAP_CAUSES)."""
    gaps = []
    ordered = sorted(compute, key=lambda et: et[0]["ts"])
    busy_until = None
    before = None
    nccl_busy = union([(e["ts"], e["ts"] + e["dur"]) for e, _ in nccl])
    for e, launched in ordered:
        start = e["ts"]
        if busy_until is not None and start > busy_until:
            if launched > busy_until:
                why = "host"
            elif covered(busy_until, start, nccl_busy) > 0:
                why = "nccl"
            else:
                why = "waiting"
            gaps.append({"start": busy_until, "ms": (start - busy_until) / 1e3, "why": why,
                         "after": short(before["name"]), "before": short(e["name"])})
        end = start + e["dur"]
        if busy_until is None or end > busy_until:
            busy_until, before = end, e
    # After the last compute kernel: the step waits for the collectives still running.
    if busy_until is not None and step_end > busy_until:
        gaps.append({"start": busy_until, "ms": (step_end - busy_until) / 1e3, "why": "nccl",
                     "after": short(before["name"]), "before": "(end of step)"})
    return gaps


def class_times(compute):
    """Milliseconds of compute kernels by kernel_class (their durations summed)."""
    out = {}
    for e, _ in compute:
        label = kernel_class(e["name"])
        out[label] = out.get(label, 0.0) + e["dur"] / 1e3
    return out


def svg(kernels, ref, path, width=1600):
    streams = sorted({e.get("args", {}).get("stream", e.get("tid")) for e, _ in kernels},
                     key=str)
    t0 = min(e["ts"] for e, _ in kernels)
    t1 = max(e["ts"] + e["dur"] for e, _ in kernels)
    scale = (width - 120) / max(t1 - t0, 1)
    lane = 28
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{lane * len(streams) + 60}" font-family="sans-serif" font-size="11">']
    for i, s in enumerate(streams):
        y = 20 + i * lane
        out.append(f'<text x="2" y="{y + 16}">stream {s}</text>')
    for e, _ in kernels:
        s = e.get("args", {}).get("stream", e.get("tid"))
        y = 20 + streams.index(s) * lane
        x = 110 + (e["ts"] - t0) * scale
        w = max(e["dur"] * scale, 0.5)
        color = "#d62728" if is_nccl(e) else "#1f77b4"
        # Cut first, then escape: cutting an escaped name can split an entity ("&lt" without ";").
        name = escape(e["name"][:80])
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.2f}" height="{lane - 6}" fill="{color}">'
                   f'<title>{name} {e["dur"] / 1e3:.3f} ms</title></rect>')
    xr = 110 + (ref - t0) * scale
    out.append(f'<line x1="{xr:.1f}" x2="{xr:.1f}" y1="10" y2="{lane * len(streams) + 30}" '
               'stroke="black" stroke-dasharray="4"/>')
    out.append(f'<text x="{xr + 3:.1f}" y="{lane * len(streams) + 45}">end of backward\'s compute'
               f'</text><text x="110" y="12">{(t1 - t0) / 1e3:.2f} ms; blue compute, red NCCL'
               '</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(out))


def print_classes(classes, baseline=None):
    """Compute time by kernel class; with a baseline, its time and the difference (the slowdown)."""
    labels = sorted(set(classes) | set(baseline or {}), key=lambda k: -classes.get(k, 0.0))
    head = f"{'class':>12} {'ms':>8}"
    if baseline is not None:
        head += f" {'1 GPU':>8} {'slower':>8}"
    print(head)
    for label in labels + ["total"]:
        ours = sum(classes.values()) if label == "total" else classes.get(label, 0.0)
        line = f"{label:>12} {ours:8.3f}"
        if baseline is not None:
            base = sum(baseline.values()) if label == "total" else baseline.get(label, 0.0)
            line += f" {base:8.3f} {ours - base:+8.3f}"
        print(line)


def print_gaps(gaps, top):
    """The idle gaps' totals by cause, then the `top` longest, named by their neighbours."""
    total = sum(g["ms"] for g in gaps)
    by_cause = ", ".join(f"{why} {sum(g['ms'] for g in gaps if g['why'] == why):.3f}"
                         for why in GAP_CAUSES)
    print(f"idle gaps: {len(gaps)}, {total:.3f} ms ({by_cause})")
    for g in sorted(gaps, key=lambda g: -g["ms"])[:top]:
        print(f"  gap {g['ms']:7.3f} ms {g['why']:>7}  after {g['after']}  before {g['before']}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--svg", default=None)
    p.add_argument("--baseline", default=None,
                   help="a one-GPU trace of the same model: compute time by kernel class against it")
    p.add_argument("--gaps", type=int, default=12, help="how many of the longest gaps to list")
    args = p.parse_args()
    summary, rows, kernels, ref = analyze(load(args.trace), args.step)
    gaps, classes = summary.pop("gaps"), summary.pop("classes")
    print("attribution " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in summary.items()))
    print_classes(classes, analyze(load(args.baseline))[0]["classes"] if args.baseline else None)
    print_gaps(gaps, args.gaps)
    print(f"{'bucket':>6} {'launch':>8} {'start':>8} {'end':>8} {'dur':>7} {'hidden':>7}  "
          "(ms, relative to the end of backward's compute)")
    for r in rows:
        print(f"{r['bucket']:>6} {r['launch_ms']:8.3f} {r['start_ms']:8.3f} {r['end_ms']:8.3f} "
              f"{r['dur_ms']:7.3f} {r['hidden_ms']:7.3f}  {r['name']}")
    if args.svg:
        svg(kernels, ref, args.svg)


if __name__ == "__main__":
    sys.exit(main())
