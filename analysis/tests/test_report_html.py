"""The run pages `summarize` writes, loaded in a real headless browser (browser.py): the sections
are there, the numbers are metrics.json's, every image decodes, nothing is fetched or run, and
strings from the rank files are text, never markup."""

import base64
import json
import re
import shutil
from urllib.parse import quote

import h5py
import numpy as np
import pytest
from matplotlib import image as mpimg

from analysis import numbers as fmt
from analysis.__main__ import main
from browser import decoded_images, dump_dom, png_size, run_browser
from conftest import FIXTURES, load_json


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    assert main(["summarize", str(FIXTURES / "dp2"), str(FIXTURES / "pp_1f1b_m4"), "--out", str(out)]) == 0
    return out


def test_the_page_has_every_section_and_metrics_json_numbers(pages, tmp_path):
    m = load_json(pages / "pp_1f1b_m4" / "metrics.json")
    dom = dump_dom(tmp_path, pages / "pp_1f1b_m4" / "index.html")
    for section in ("identity", "summary", "plots", "ranks", "config", "summary-table", "epochs",
                    "step-breakdown-table", "fig-step-breakdown", "fig-loss", "fig-timeline"):
        assert section in dom.ids, section
    assert dom.text("status") == "finished"
    assert dom.text("id-program") == "pp_train" and dom.text("id-what") == m["label"]
    assert dom.text("id-ranks") == "2"
    assert dom.text("id-commit") == m["ranks"][0]["git_commit"]
    assert dom.text("id-started") == "2026-11-30T22:38:39Z"
    assert dom.text("id-devices") == "vm cpu"

    def value(cell):
        return float(dom.attr(cell, "data-value"))
    t, p, loss = m["throughput"], m["performance"], m["losses"]
    assert value("tok-s") == t["tok_s_mean"] and float(dom.attr("tok-s", "data-std")) == t["tok_s_std"]
    assert dom.text("tok-s") == fmt.mean_pm(t["tok_s_mean"], t["tok_s_std"], len(t["epochs_used"])) + " tok/s"
    assert value("hw5-tok") == p["tok_mean"] and value("hw5-time") == p["time_mean"]
    assert value("train-loss") == loss["final_train_loss"] and value("val-loss") == loss["final_val_loss"]
    assert value("bubble") == m["pipeline_bubble"]["measured"]
    assert value("step-time") == max(r["total"] for r in m["step_breakdown"])
    for r in m["step_breakdown"]:
        for phase in ("data", "forward", "backward", "sync_exposed", "optimizer", "other", "total"):
            assert value(f"rank-{r['rank']}-{phase}") == r[phase]
    for epoch, tok_s in enumerate(t["tok_s_per_epoch"]):  # the fixture's epochs: 0, 1, 2
        assert value(f"epoch-{epoch}-tok-s") == tok_s
        assert value(f"epoch-{epoch}-hw5-tok") == p["tok_per_epoch"][epoch]
        assert value(f"epoch-{epoch}-time") == p["time_per_epoch"][epoch]
    # Each figure is labelled with what it is; HW5's rows say they are HW5's, with HW5's definition.
    rows = {" ".join(x.split()) for x in re.findall(r"<tr><th>(.*?)</th>", dom.source)}
    assert {"tok/s (all ranks, padded)", "HW5 time/epoch", "HW5 tok/s", "step time"} <= rows
    assert t["tok_s_definition"] in " ".join(dom.source.split())
    assert p["tokens_per_sec_definition"] in " ".join(dom.source.split())


def test_the_page_is_one_static_file(pages):
    text = (pages / "pp_1f1b_m4" / "index.html").read_text()
    assert "<script" not in text.lower() and 'http-equiv="refresh"' not in text
    assert "default-src 'none'; img-src data:" in text  # the browser refuses anything else
    srcs = re.findall(r'\ssrc="([^"]*)"', text)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"(src|href)=\"(https?:)?//", text)
    # The images are the PNGs beside the page.
    for src, name in zip(srcs, ("step_breakdown.png", "loss.png", "pipeline_timeline.png")):
        assert base64.b64decode(src.split(",", 1)[1]) == (pages / "pp_1f1b_m4" / name).read_bytes()


def test_every_image_decodes_in_the_browser(pages, tmp_path):
    page = pages / "pp_1f1b_m4" / "index.html"
    images = decoded_images(tmp_path, page)
    assert [i["alt"] for i in images] == ["Step time breakdown", "Loss", "Pipeline timeline"]
    for i, name in zip(images, ("step_breakdown.png", "loss.png", "pipeline_timeline.png")):
        assert i["complete"] and (i["width"], i["height"]) == png_size((page.parent / name).read_bytes()), i
        assert 0.01 < i["ink"] < 0.9, i  # drawn: axes, bars, text on white
    # The check sees a broken image: a copy whose first image's data is damaged.
    broken = tmp_path / "broken" / "index.html"
    broken.parent.mkdir()
    broken.write_text(page.read_text().replace("base64,iVBORw0KGgo", "base64,AAAAAAAAAAA", 1))
    damaged = decoded_images(tmp_path, broken)
    assert damaged[0]["width"] == 0 and damaged[0]["ink"] == -1 and damaged[1]["ink"] > 0.01


def test_the_rendered_page_is_not_blank(pages, tmp_path):
    shot = tmp_path / "page.png"
    run_browser(tmp_path, pages / "pp_1f1b_m4" / "index.html", f"--screenshot={shot}",
                "--window-size=1200,2400", "--hide-scrollbars")
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1200)
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 200  # text, table rules and three plots; a blank page has one colour
    assert (pixels < 0.5).mean() > 0.005  # dark ink somewhere


def test_several_runs_get_an_index_linking_their_pages(pages, tmp_path):
    s = load_json(pages / "summary.json")
    dom = dump_dom(tmp_path, pages / "index.html")
    assert [a["href"] for a in dom.all("a")] == ["dp2/index.html", "pp_1f1b_m4/index.html"]
    for r in s["runs"]:
        assert float(dom.attr(f"run-{r['name']}-tok-s", "data-value")) == r["throughput"]["tok_s_mean"]
        assert (pages / r["name"] / "index.html").is_file()


def test_a_single_run_gets_its_page_and_no_index(fixtures, tmp_path):
    assert main(["summarize", str(fixtures / "dp1"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "dp1" / "index.html").is_file() and not (tmp_path / "index.html").exists()


HOSTILE = {"host": '<script>document.title="host"</script>', "gpu_name": "<b>bold</b>",
           "git_commit": '"><img src=x onerror="document.title=1">',
           "versions": json.dumps({"<i>lib</i>": "<script>x()</script>"})}


def test_strings_from_rank_files_are_text_not_markup(fixtures, tmp_path):
    name = '<img src=x onerror="document.title=2">'
    runs = tmp_path / "runs"
    (runs / name).mkdir(parents=True)
    shutil.copytree(fixtures / "dp1", runs / "plain")
    shutil.copy(fixtures / "dp1" / "rank0.h5", runs / name / "rank0.h5")
    with h5py.File(runs / name / "rank0.h5", "r+") as f:
        for k, v in HOSTILE.items():
            f.attrs[k] = v
        cfg = json.loads(f.attrs["config"])
        cfg["</td></tr></table><script>y()</script>"] = "<style>body{display:none}</style>"
        f.attrs["config"] = json.dumps(cfg)
    out = tmp_path / "out"
    assert main(["summarize", str(runs), "--out", str(out)]) == 0
    page = out / name / "index.html"
    text = page.read_text()
    assert "<script" not in text and "<b>" not in text and "<i>" not in text and "<style>body" not in text
    dom = dump_dom(tmp_path, page)
    assert not dom.all("script") and not dom.all("b") and not dom.all("i")
    assert len(dom.all("img")) == 2 and all(a["src"].startswith("data:image/png") for a in dom.all("img"))
    assert len(dom.all("style")) == 1 and len(dom.all("table")) == 6
    assert dom.text("id-run") == name
    assert dom.text("id-devices") == f'{HOSTILE["host"]} cpu {HOSTILE["gpu_name"]}'
    assert dom.text("id-commit") == HOSTILE["git_commit"]
    assert "<script>x()</script>" in dom.text("id-versions")
    assert "<style>body{display:none}</style>" in dom.text("config")
    index = dump_dom(tmp_path, out / "index.html")
    assert not index.all("script") and len(index.all("img")) == 0
    hrefs = [a["href"] for a in index.all("a")]
    assert quote(name) + "/index.html" in hrefs
