"""Where a profiled training step's time went, read from its torch profiler trace (Chrome JSON).

The profiler's operator table ranks operators by GPU time; it does not say how long the GPU sat idle
between kernels, nor what the host was doing meanwhile. A step held up by its host (kernel launches, a
plan built for each new shape, a copy that waits for the GPU) shows here: the GPU's busy share of the
step, the gaps between kernels longer than `GAP_MS`, and the innermost host operator running across
each such gap.

    python -m benchmarks.step_profile trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np

GAP_MS = 1.0
"""A GPU idle stretch at least this long is a gap the host is asked about (shorter ones are launch latency)."""

ATTENTION_KERNEL = re.compile(r"sdpa|fmha|flash|attention", re.IGNORECASE)
"""Kernel names of attention: cuDNN's (`...sdpa...`), FlashAttention's and the memory-efficient kernel's (`fmha`)."""

TOP = 5


def read_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as trace:
        return json.load(trace)


def summarise(trace: dict) -> dict:
    """The step's span, the GPU's busy share of it, attention's share of kernel time, the top kernels,
    and the host operators across the GPU's gaps (name -> gaps, seconds)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if not events:
        raise ValueError("the trace holds no timed events")
    start = min(e["ts"] for e in events)
    span_us = max(e["ts"] + e["dur"] for e in events) - start
    kernels = [e for e in events if e.get("cat") == "kernel"]
    summary = {"span_s": span_us / 1e6, "kernels": len(kernels)}
    if not kernels:
        return summary
    kernel_us = sum(e["dur"] for e in kernels)
    gaps = idle_gaps(kernels)
    by_kernel: defaultdict[str, float] = defaultdict(float)
    for kernel in kernels:
        by_kernel[kernel["name"]] += kernel["dur"]
    return {
        **summary,
        "gpu_busy_share": (sum(end - begin for begin, end in busy_intervals(kernels))) / span_us,
        "attention_share": sum(t for name, t in by_kernel.items() if ATTENTION_KERNEL.search(name)) / kernel_us,
        "top_kernels": [
            {"name": name, "share": t / kernel_us} for name, t in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:TOP]
        ],
        "gaps_s": sum(end - begin for begin, end in gaps) / 1e6,
        "host_in_gaps": host_operators_across(gaps, [e for e in events if e.get("cat") == "cpu_op"]),
    }


def busy_intervals(kernels: list[dict]) -> list[tuple[float, float]]:
    """The union of the kernels' time intervals (kernels on several streams overlap)."""
    merged: list[tuple[float, float]] = []
    for begin, end in sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def idle_gaps(kernels: list[dict]) -> list[tuple[float, float]]:
    busy = busy_intervals(kernels)
    return [(a_end, b_begin) for (_, a_end), (b_begin, _) in pairwise(busy) if b_begin - a_end >= GAP_MS * 1e3]


def host_operators_across(gaps: list[tuple[float, float]], operators: list[dict]) -> list[dict]:
    """For each gap, the shortest host operator spanning its middle; grouped by name, longest total first."""
    if not operators:
        return []
    begins = np.array([op["ts"] for op in operators], dtype=float)
    ends = begins + np.array([op["dur"] for op in operators], dtype=float)
    gaps_by_name: Counter[str] = Counter()
    seconds: defaultdict[str, float] = defaultdict(float)
    for begin, end in gaps:
        middle = (begin + end) / 2
        spanning = np.flatnonzero((begins <= middle) & (ends >= middle))
        name = operators[spanning[np.argmin(ends[spanning] - begins[spanning])]]["name"] if spanning.size else "-"
        gaps_by_name[name] += 1
        seconds[name] += (end - begin) / 1e6
    return [
        {"name": name, "gaps": gaps_by_name[name], "seconds": seconds[name]}
        for name in sorted(seconds, key=lambda n: -seconds[n])
    ]


def describe(summary: dict) -> str:
    """One line for a report."""
    if "gpu_busy_share" not in summary:
        return f"{summary['span_s']:.2f} s, no GPU kernels in the trace"
    host = "; ".join(f"{h['name']} ({h['gaps']} gaps, {h['seconds']:.2f} s)" for h in summary["host_in_gaps"][:TOP])
    kernels = "; ".join(f"{k['name'][:60]} {k['share']:.0%}" for k in summary["top_kernels"])
    return (
        f"GPU busy {summary['gpu_busy_share']:.0%} of {summary['span_s']:.2f} s; attention kernels "
        f"{summary['attention_share']:.0%} of GPU time; idle in gaps over {GAP_MS:g} ms: {summary['gaps_s']:.2f} s, "
        f"the host meanwhile in: {host or 'none'}; top kernels: {kernels}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="A torch profiler Chrome trace (.json or .json.gz).")
    summary = summarise(read_trace(parser.parse_args(argv).trace))
    print(describe(summary))
    return summary


if __name__ == "__main__":
    main()
