"""results/ keeps tables, plots and READMEs; raw rank files (HDF5) only where a figure or table is
drawn from them, and then the folder's README names the folder that holds them and what it
draws from them. A rank file committed without such a line fails here."""
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tracked_rank_files():
    out = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [p for p in out if p.endswith(".h5") or p.endswith(".h5.partial")]


def test_every_rank_file_is_named_by_its_readme():
    files = tracked_rank_files()
    unexplained = []
    for path in files:
        parts = pathlib.PurePosixPath(path).parts  # results, <folder>, ..., rankN.h5
        readme = ROOT / parts[0] / parts[1] / "README.md"
        text = readme.read_text() if readme.exists() else ""
        folders = parts[2:-1]
        if not ("h5" in text or "hdf5" in text.lower()) or not any(f"{name}/" in text or f"`{name}`" in text
                                       for name in folders):
            unexplained.append(path)
    assert not unexplained, (
        "rank files under results/ whose README does not say which figure is drawn from them "
        "(name their folder in the README, or remove them): " + ", ".join(sorted(unexplained)))
