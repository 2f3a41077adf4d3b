#!/usr/bin/env python3
"""The scaling table of scripts/gpu-scaling.sh's final stage, from its summary lines:

  final <model> round <k> <side>: <ms> ms      (side: ours-1gpu, ours-ddp-w<W>, torch-ddp-w<W>,
                                               torch-ddp-tuned-w<W>, ours-fsdp-w<W>)

One markdown table per model: per world, the median over the rounds of each side, our scaling
(one GPU's step / ours at W), ours against PyTorch's default and tuned DDP, and FULLY_SHARD against
our DDP. A missing side shows as a dash.

  bench/scaling_table.py SUMMARY.txt
"""
import re
import statistics
import sys

LINE = re.compile(r"^final (\S+) round \d+ (\S+): ([0-9.]+) ms")


def parse(lines):
    """{model: {side: [ms, ...]}} from the summary's final lines (others ignored)."""
    out = {}
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            model, side, ms = m.group(1), m.group(2), float(m.group(3))
            out.setdefault(model, {}).setdefault(side, []).append(ms)
    return out


def table(model, sides):
    med = {k: statistics.median(v) for k, v in sides.items()}
    worlds = sorted({int(m.group(1)) for k in med for m in [re.search(r"-w(\d+)$", k)] if m})
    one = med.get("ours-1gpu")

    def cell(v, fmt="{:.2f}"):
        return fmt.format(v) if v is not None else "-"

    def ratio(a, b, fmt="{:.3f}"):
        return fmt.format(a / b) if a is not None and b else "-"

    rows = [f"{model}: median step ms over "
            f"{max((len(v) for v in sides.values()), default=0)} rounds",
            "| world | one GPU | ours DDP | PyTorch DDP | PyTorch tuned | ours FULLY_SHARD | "
            "scaling | ours / PyTorch | ours / tuned | FULLY_SHARD / ours DDP |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for w in worlds:
        ours = med.get(f"ours-ddp-w{w}")
        torch = med.get(f"torch-ddp-w{w}")
        tuned = med.get(f"torch-ddp-tuned-w{w}")
        fsdp = med.get(f"ours-fsdp-w{w}")
        scaling = f"{100 * one / ours:.1f}%" if one and ours else "-"
        rows.append(f"| {w} | {cell(one)} | {cell(ours)} | {cell(torch)} | {cell(tuned)} | "
                    f"{cell(fsdp)} | {scaling} | {ratio(ours, torch)} | {ratio(ours, tuned)} | "
                    f"{ratio(fsdp, ours)} |")
    return "\n".join(rows)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        models = parse(f)
    if not models:
        raise SystemExit(f"scaling_table: no 'final <model> round <k> <side>: <ms> ms' lines in "
                         f"{sys.argv[1]}")
    print("\n\n".join(table(m, s) for m, s in models.items()))


if __name__ == "__main__":
    main()
