import shutil

import pytest

from analysis.reader import RunError, find_runs, read_run


def test_reads_every_rank_with_attributes(fixtures):
    run = read_run(fixtures / "dp2")
    assert [r.rank for r in run.ranks] == [0, 1]
    assert run.program == "dp_train" and run.world_size == 2 and not run.partial
    assert run.config["batch_size"] == 16
    assert run.ranks[0].rows("steps") > 0 and run.ranks[0].rows("epochs") == 3
    assert run.ranks[0].rows("actions") == 0


def crashed_run(fixtures, d):
    d.mkdir()
    shutil.copy(fixtures / "dp2" / "rank0.h5", d / "rank0.h5")
    shutil.copy(fixtures / "dp2_partial" / "rank1.h5.partial", d / "rank1.h5.partial")
    return d


def test_partial_file_is_read_with_a_warning(fixtures, tmp_path, capsys):
    run = read_run(crashed_run(fixtures, tmp_path / "run"))
    assert run.partial and run.ranks[1].partial and not run.ranks[0].partial
    assert run.ranks[1].rows("epochs") == 2
    err = capsys.readouterr().err
    assert "rank1.h5.partial: unfinished timing file" in err and "2 epoch rows" in err


def test_metrics_use_the_epochs_every_rank_finished(fixtures, tmp_path):
    from analysis import metrics
    t = metrics.epoch_table(read_run(crashed_run(fixtures, tmp_path / "run")))
    assert t["epoch"].tolist() == [0, 1]


def test_missing_rank_file_warns(fixtures, capsys):
    run = read_run(fixtures / "dp2_partial")
    assert len(run.ranks) == 1
    assert "1 rank file(s) for world_size 2" in capsys.readouterr().err


def test_final_file_wins_over_a_stale_partial(fixtures, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(fixtures / "dp2", d)
    shutil.copy(fixtures / "dp2_partial" / "rank1.h5.partial", d / "rank1.h5.partial")
    run = read_run(d)
    assert not run.partial and run.ranks[1].rows("epochs") == 3


def test_missing_and_empty_directories_say_what_to_pass(tmp_path):
    with pytest.raises(RunError, match="no such run directory"):
        read_run(tmp_path / "nope")
    with pytest.raises(RunError, match="no rank<r>.h5 files; is this the --out directory"):
        read_run(tmp_path)


def test_unreadable_partial_file_explains_the_crash(tmp_path):
    (tmp_path / "rank0.h5.partial").write_bytes(b"not hdf5")
    with pytest.raises(RunError, match="cannot open as HDF5.*delete it or rerun"):
        read_run(tmp_path)


def test_mixed_runs_are_detected(fixtures, tmp_path):
    shutil.copy(fixtures / "dp2" / "rank1.h5", tmp_path / "rank0.h5")
    with pytest.raises(RunError, match="file name says rank 0 but attribute rank is 1"):
        read_run(tmp_path)


def test_find_runs_below_a_parent(fixtures):
    names = [p.name for p in find_runs(fixtures)]
    assert {"dp1", "dp2", "dp2_partial", "pp_mp", "pp_1f1b_m4"} <= set(names)


def with_op_table(fixtures, tmp_path, table):
    """pp_1f1b_m4's rank files with an action_ops attribute (and codes) from `table`."""
    import json

    import h5py
    import numpy as np

    src = fixtures / "pp_1f1b_m4"
    for p in src.glob("rank*.h5"):
        shutil.copy(p, tmp_path / p.name)
        with h5py.File(tmp_path / p.name, "r+") as f:
            names = {0: "forward", 1: "backward", 2: "send activation", 3: "recv activation",
                     4: "send grad", 5: "recv grad", 6: "optimizer", 7: "weight grad"}
            by_name = {v: int(k) for k, v in table.items()}
            ops = f["actions"]["op"][...]
            f["actions"]["op"][...] = np.array([by_name.get(names[int(o)], 99) for o in ops], dtype=ops.dtype)
            f.attrs["action_ops"] = json.dumps(table)
    return tmp_path


def test_op_codes_are_read_by_name_from_the_file(fixtures, tmp_path):
    plain = read_run(fixtures / "pp_1f1b_m4")
    # The same run written with other codes for the same ops reads back the same.
    shifted = {str(10 + c): n for c, n in [(0, "forward"), (1, "backward"), (2, "send activation"),
                                            (3, "recv activation"), (4, "send grad"), (5, "recv grad"),
                                            (6, "optimizer"), (7, "weight grad")]}
    run = read_run(with_op_table(fixtures, tmp_path, shifted))
    for a, b in zip(plain.ranks, run.ranks):
        assert (a.table("actions")["op"] == b.table("actions")["op"]).all()


def test_an_op_the_analysis_does_not_know_is_refused(fixtures, tmp_path):
    table = {"0": "forward", "1": "backward", "2": "send activation", "3": "recv activation",
             "4": "send grad", "5": "recv grad", "6": "optimizer", "7": "teleport"}
    with pytest.raises(RunError, match="teleport unknown to this analysis"):
        read_run(with_op_table(fixtures, tmp_path, table))
