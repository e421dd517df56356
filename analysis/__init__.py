"""Analysis of gpt2-parallel runs: reads every rank's <run>/rank<r>.h5 (layout in
include/gpt2p/io/run_record.h), computes HW5's metrics, writes JSON summaries and plots.

    python3 -m analysis summarize RUN_DIR... --out DIR
    python3 -m analysis hw5 --dp-single D --dp-multi D --pp-model-parallel D --pp-pipeline D --out DIR
    python3 -m analysis timeline RUN_DIR --out DIR
    python3 -m analysis sweep RUN_DIR... --out DIR
    python3 -m analysis.matrix_table OUT_DIR --warmup W   (the table of a scripts/benchmark run)
"""

__version__ = "0.1.0"
