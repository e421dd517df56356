"""performance_summary.json (HW5's schema), its plots, and the grader's exit codes."""

import math

import pytest

from analysis import metrics, summary
from analysis.__main__ import main
from analysis.reader import read_run
from conftest import load_json

STATS = {"time_mean", "time_std", "tok_mean", "tok_std"}


def hw5_args(fixtures, out, *extra):
    return ["hw5", "--dp-single", str(fixtures / "dp1"), "--dp-multi", str(fixtures / "dp2"),
            "--pp-model-parallel", str(fixtures / "pp_mp"), "--pp-pipeline",
            str(fixtures / "pp_1f1b_m4"), "--out", str(out), *extra]


def test_summary_schema_and_values(fixtures, tmp_path):
    assert main(hw5_args(fixtures, tmp_path)) == 0
    s = load_json(tmp_path / "performance_summary.json")
    assert set(s) == {"config", "data_parallel", "pipeline_parallel"}
    assert set(s["config"]) == {"epochs", "warmup_epochs_dropped", "pipeline_batch_size", "pipeline_n_chunk"}
    assert s["config"] == {"epochs": 3, "warmup_epochs_dropped": 1, "pipeline_batch_size": 16,
                           "pipeline_n_chunk": 4}
    dp, pp = s["data_parallel"], s["pipeline_parallel"]
    # HW5's keys, and one added beside them: what HW5's tok_mean / tok_std are.
    assert set(dp) == {"single_gpu", "two_gpu", "speedup_time_reduction_x", "speedup_throughput_x",
                       "tokens_per_sec_definition"}
    assert set(pp) == {"model_parallel", "pipeline_parallel", "speedup_time_reduction_x", "speedup_throughput_x",
                       "tokens_per_sec_definition"}
    assert dp["tokens_per_sec_definition"] == metrics.HW5_TOK_DP_DEFINITION
    assert pp["tokens_per_sec_definition"] == metrics.HW5_TOK_PP_DEFINITION
    assert dp["tokens_per_sec_definition"].startswith("HW5's tokens/s: the sum over ranks")
    for sec in (dp["single_gpu"], dp["two_gpu"], pp["model_parallel"], pp["pipeline_parallel"]):
        assert set(sec) == STATS and all(math.isfinite(v) for v in sec.values())
    assert dp["speedup_time_reduction_x"] == pytest.approx(dp["single_gpu"]["time_mean"] / dp["two_gpu"]["time_mean"])
    assert dp["speedup_throughput_x"] == pytest.approx(dp["two_gpu"]["tok_mean"] / dp["single_gpu"]["tok_mean"])
    assert pp["speedup_time_reduction_x"] == pytest.approx(
        pp["model_parallel"]["time_mean"] / pp["pipeline_parallel"]["time_mean"])
    for name in ("ddp_training_time", "ddp_tokens_per_second", "pp_training_time", "pp_tokens_per_second"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert set(load_json(tmp_path / "hw5_details.json")) == {"dp_single", "dp_multi", "pp_model", "pp_pipeline"}


def test_warmup_override_reaches_the_summary(fixtures, tmp_path):
    assert main(hw5_args(fixtures, tmp_path, "--warmup-epochs", "0")) == 0
    s = load_json(tmp_path / "performance_summary.json")
    assert s["config"]["warmup_epochs_dropped"] == 0


def test_grader_exit_codes(fixtures, tmp_path, capsys):
    s = summary.hw5_summary(read_run(fixtures / "dp1"), read_run(fixtures / "dp2"),
                            read_run(fixtures / "pp_mp"), read_run(fixtures / "pp_1f1b_m4"))
    dp_t = s["data_parallel"]["speedup_time_reduction_x"]
    # Thresholds just above / below the measured speedups: the result can only be the threshold's.
    low = ["--dp-time-threshold", "0", "--dp-throughput-threshold", "0",
           "--pp-time-threshold", "0", "--pp-throughput-threshold", "0"]
    assert main(hw5_args(fixtures, tmp_path, "--grade", *low)) == 0
    assert "GRADE: pass" in capsys.readouterr().out
    high = list(low)
    high[1] = str(dp_t * 1.01)
    assert main(hw5_args(fixtures, tmp_path, "--grade", *high)) == 2
    out = capsys.readouterr().out
    assert "DP training-time reduction: data_parallel.speedup_time_reduction_x" in out
    assert "DP throughput" not in out and "PP" not in out


def test_grader_with_hw5_defaults_flags_each_check_below(fixtures):
    s = summary.hw5_summary(read_run(fixtures / "dp1"), read_run(fixtures / "dp2"), None, None)
    th = dict(summary.DEFAULT_THRESHOLDS)
    failures = summary.grade(s, th)
    assert "PP training-time reduction: not measured (pass the pipeline parallel run directories)" in failures
    dp = s["data_parallel"]
    expected_dp = (dp["speedup_time_reduction_x"] < 1.5) + (dp["speedup_throughput_x"] < 1.5)
    assert sum(f.startswith("DP") for f in failures) == expected_dp
    assert s["pipeline_parallel"] is None


def test_hw5_without_runs_is_an_error(tmp_path, capsys):
    assert main(["hw5", "--out", str(tmp_path)]) == 1
    assert "pass at least --dp-single and --dp-multi" in capsys.readouterr().err


def test_printed_table_says_the_numbers_are_hw5s_and_never_uses_scientific_notation(fixtures, tmp_path, capsys):
    assert main(hw5_args(fixtures, tmp_path)) == 0
    out = capsys.readouterr().out
    s = load_json(tmp_path / "performance_summary.json")
    assert "# section" in out and "HW5 time/epoch s" in out and "HW5 tok/s" in out
    assert "HW5's tokens/s: the sum over ranks of each rank's padded tokens" in out.replace("\n#   ", " ")
    one = s["data_parallel"]["single_gpu"]
    row = next(line for line in out.splitlines() if "single_gpu" in line)
    # value and spread to the same decimal place, from the spread's two significant digits
    assert f"{one['tok_mean']:.1f} ± {one['tok_std']:.1f}" in row, row
    assert f"{one['time_mean']:.3f} ± {one['time_std']:.3f}" in row, row
    assert "e+" not in out and "±0" not in out
