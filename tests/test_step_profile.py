"""A profiled step's trace says how long the GPU sat idle and what the host was doing meanwhile."""

from __future__ import annotations

import pytest

from benchmarks import step_profile


def kernel(name: str, start_ms: float, duration_ms: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start_ms * 1e3, "dur": duration_ms * 1e3}


def host(name: str, start_ms: float, duration_ms: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": start_ms * 1e3, "dur": duration_ms * 1e3}


def test_a_step_profile_names_the_host_operator_the_gpu_waited_on():
    """Two GEMMs, an attention kernel, and 60 ms of idle GPU while the host built an attention plan."""
    trace = {
        "traceEvents": [
            host("aten::linear", 0, 10),
            kernel("gemm", 0, 10),
            host("aten::scaled_dot_product_attention", 10, 62),  # the outer call, and inside it
            host("aten::_cudnn_attention_forward", 11, 60),  # the plan build: the innermost across the gap
            kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 70, 5),
            kernel("gemm", 75.5, 25),  # 0.5 ms after: launch latency, not a gap
        ]
    }
    summary = step_profile.summarise(trace)
    assert summary["span_s"] == pytest.approx(0.1005)
    assert summary["gpu_busy_share"] == pytest.approx(40 / 100.5)
    assert summary["attention_share"] == pytest.approx(5 / 40)
    assert summary["gaps_s"] == pytest.approx(0.060)
    assert summary["host_in_gaps"] == [
        {"name": "aten::_cudnn_attention_forward", "gaps": 1, "seconds": pytest.approx(0.06)}
    ]
    assert summary["top_kernels"][0] == {"name": "gemm", "share": pytest.approx(35 / 40)}
    line = step_profile.describe(summary)
    assert "GPU busy 40% of 0.10 s" in line and "aten::_cudnn_attention_forward (1 gaps, 0.06 s)" in line


def test_a_cpu_trace_says_it_has_no_gpu_kernels():
    summary = step_profile.summarise({"traceEvents": [host("aten::mm", 0, 3)]})
    assert step_profile.describe(summary) == "0.00 s, no GPU kernels in the trace"
    with pytest.raises(ValueError, match="no timed events"):
        step_profile.summarise({"traceEvents": []})
