"""Rank files that resumed runs appended to (a /segments table, include/gpt2p/io/run_record.h)."""
import json

import h5py
import numpy as np

from analysis.reader import read_run


def write_rank_file(path, tables, world_size=1):
    with h5py.File(path, "w") as f:
        f.attrs["program"] = "dp_train"
        f.attrs["config"] = json.dumps({"batch_size": 4})
        f.attrs["world_size"] = world_size
        f.attrs["rank"] = 0
        for name, columns in tables.items():
            g = f.create_group(name)
            for column, values in columns.items():
                g.create_dataset(column, data=np.asarray(values, dtype=np.float64), maxshape=(None,))


def resumed_tables():
    # Run 1: steps 0..2 (epoch 0, then the first step of epoch 1), epoch 0 finished. It crashed;
    # run 2 resumed from the checkpoint at step 2 and redid step 2, then step 3 and epoch 1.
    return {
        "steps": {"step": [0, 1, 2, 2, 3], "epoch": [0, 0, 1, 1, 1],
                  "start": [1.0, 2.0, 3.0, 0.5, 1.5], "end": [2.0, 3.0, 4.0, 1.5, 2.5],
                  "loss": [9.0, 8.0, 7.5, 7.0, 6.0]},
        "epochs": {"epoch": [0, 1], "train_time": [2.0, 2.0]},
        "actions": {"step": [], "start": [], "end": []},
        "segments": {"steps_row": [0, 3], "epochs_row": [0, 1], "actions_row": [0, 0],
                     "started": [np.nan, 1.7e9]},
    }


def test_appended_runs_read_as_one_with_the_latest_rows_and_increasing_times(tmp_path):
    write_rank_file(tmp_path / "rank0.h5", resumed_tables())
    rank = read_run(tmp_path).ranks[0]
    steps = rank.table("steps")
    assert steps["step"].tolist() == [0, 1, 2, 3]
    assert steps["loss"].tolist() == [9.0, 8.0, 7.0, 6.0]  # step 2 from the resumed run
    assert steps["start"].tolist() == [1.0, 2.0, 4.5, 5.5]  # run 2's clock follows run 1's end
    assert np.all(np.diff(steps["end"]) > 0)
    assert rank.table("epochs")["epoch"].tolist() == [0, 1]
    assert rank.rows("actions") == 0 and rank.segments == 2
    assert "segments" not in rank.tables


def test_a_resume_that_redoes_an_epoch_keeps_only_its_rows(tmp_path):
    t = resumed_tables()
    t["steps"]["epoch"] = [0, 0, 0, 0, 0]  # run 1 finished epoch 0 but resumed inside it
    t["epochs"] = {"epoch": [0, 0], "train_time": [2.0, 3.0]}
    write_rank_file(tmp_path / "rank0.h5", t)
    epochs = read_run(tmp_path).ranks[0].table("epochs")
    assert epochs["epoch"].tolist() == [0] and epochs["train_time"].tolist() == [3.0]


def test_a_file_of_one_run_is_read_as_it_is(tmp_path):
    t = resumed_tables()
    t["segments"] = {"steps_row": [0], "epochs_row": [0], "actions_row": [0], "started": [1.7e9]}
    write_rank_file(tmp_path / "rank0.h5", t)
    rank = read_run(tmp_path).ranks[0]
    assert rank.table("steps")["step"].tolist() == [0, 1, 2, 2, 3] and rank.segments == 1
    del t["segments"]
    write_rank_file(tmp_path / "rank0.h5", t)
    assert read_run(tmp_path).ranks[0].rows("steps") == 5
