"""Compares a run across nodes with the same run on one node, for tests/cluster/run_cluster.sh.

    same_run.py CLUSTER_RUN_DIR SINGLE_NODE_RUN_DIR [--hosts N]

Passes (exit 0) when the model's per-step losses (the /steps table of the loss rank: rank 0, or
a pipeline's last stage) are bitwise equal in both and, with --hosts N, the cluster run's rank
files were written on N different hosts. Prints one line either way.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from analysis import metrics, reader  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cluster")
    ap.add_argument("single")
    ap.add_argument("--hosts", type=int, default=0)
    a = ap.parse_args()
    try:
        cluster, single = reader.read_run(a.cluster), reader.read_run(a.single)
    except reader.RunError as e:
        print(f"cannot read the runs: {e}")
        return 1
    got = metrics.loss_rank(cluster).table("steps").get("loss", np.array([]))
    want = metrics.loss_rank(single).table("steps").get("loss", np.array([]))
    hosts = [str(r.attrs.get("host", "?")) for r in cluster.ranks]
    where = ", ".join(f"rank {r.rank} on {h}" for r, h in zip(cluster.ranks, hosts))
    if len(got) == 0 or not np.array_equal(got, want):
        print(f"losses differ: across nodes {got.tolist()}, on one node {want.tolist()} ({where})")
        return 1
    if a.hosts and len(set(hosts)) != a.hosts:
        print(f"the ranks ran on {len(set(hosts))} host(s), not {a.hosts}: {where}")
        return 1
    print(f"{len(got)} step losses equal to the single-node run's, last {got[-1]:.6f}; {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
