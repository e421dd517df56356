"""kernel_table.py on a small Chrome trace of the shape libtorch's profiler writes."""

import json

from analysis import kernel_table


def write_trace(path, events):
    path.write_text(json.dumps({"traceEvents": events}))


def kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_kinds_times_per_step_and_idle_gap(tmp_path):
    trace = tmp_path / "trace_rank0.json"
    write_trace(trace, [
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 3000),
        kernel("void gpt2p::kernels::softmax_cross_entropy_kernel<__nv_bfloat16, 8>(...)", 3000, 1000),
        kernel("pytorch_flash::flash_fwd_kernel<...>", 4000, 500),
        kernel("void at::native::vectorized_layer_norm_kernel<float>", 4500, 250),
        kernel("Memcpy HtoD (Pinned -> Device)", 4750, 50, cat="gpu_memcpy"),
        # the second step starts after a 1 ms gap (the host)
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 5800, 3000),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9000},  # not GPU time
    ])
    t = kernel_table.table(str(trace), steps=2, top=10)
    assert t["span_ms_per_step"] == 8.8 / 2
    assert t["busy_ms_per_step"] == 7.8 / 2
    assert t["kinds"]["GEMM"] == 3.0
    assert t["kinds"]["cross-entropy (ours)"] == 0.5
    assert t["kinds"]["attention"] == 0.25
    assert t["kinds"]["LayerNorm"] == 0.125
    assert t["kinds"]["memcpy"] == 0.025
    assert t["kernels"][0]["calls_per_step"] == 1.0


def test_cli_refuses_a_trace_without_gpu_kernels(tmp_path, capsys):
    trace = tmp_path / "cpu.json"
    write_trace(trace, [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}])
    try:
        kernel_table.main([str(trace)])
    except SystemExit as e:
        assert "no GPU kernels" in str(e)
    else:
        raise AssertionError("a CPU-only trace must be refused")
    assert kernel_table.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
