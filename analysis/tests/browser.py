"""A real headless browser for the page tests: Chromium (scripts/setup installs it; GPT2P_BROWSER
names another Chromium or Chrome binary). Without one the tests fail: they are not skipped."""

import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def browser() -> str:
    named = os.environ.get("GPT2P_BROWSER")
    found = named or next((shutil.which(n) for n in NAMES if shutil.which(n)), None)
    if not found or not shutil.which(found):
        pytest.fail(f"no headless browser: {named or ', '.join(NAMES)} not found; scripts/setup installs "
                    "chromium (apt-get install chromium), or set GPT2P_BROWSER to a Chromium binary")
    return found


def run_browser(tmp_path, url: str, *flags: str) -> str:
    """Chromium's output for `url` (a file path or URL) with `flags` (e.g. --dump-dom)."""
    if not str(url).startswith("file:"):
        url = Path(url).resolve().as_uri()
    profile = Path(tmp_path) / f"profile-{os.getpid()}"
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={profile}", *flags, url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}"
    return r.stdout


def dump_dom(tmp_path, url, *flags: str) -> "Dom":
    """The page's DOM after load, as the browser serialises it."""
    return Dom(run_browser(tmp_path, url, "--dump-dom", *flags))


class Dom(HTMLParser):
    """The elements of a serialised DOM: by id (tag, attributes, text inside), every tag with its
    attributes in order."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.source, self.ids, self.tags, self._open = text, {}, [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag in VOID:
            if "id" in a:
                self.ids[a["id"]] = (tag, a, "")
            return
        self._open.append((tag, a, []))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        while self._open:  # closes what is open down to `tag`
            t, a, parts = self._open.pop()
            inner = "".join(parts)
            if "id" in a:
                self.ids[a["id"]] = (t, a, inner)
            if self._open:
                self._open[-1][2].append(inner)
            if t == tag:
                return

    def handle_data(self, data):
        if self._open:
            self._open[-1][2].append(data)

    def text(self, element_id: str) -> str:
        return " ".join(self.ids[element_id][2].split())

    def attr(self, element_id: str, name: str):
        return self.ids[element_id][1].get(name)

    def all(self, tag: str):
        return [a for t, a in self.tags if t == tag]


def png_size(data: bytes):
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


# For each image of the framed page: its natural size, and the share of its pixels that are not
# white once drawn on a canvas (drawing needs the decoded pixels; a PNG that does not decode
# draws nothing).
IMAGE_HARNESS = """<!DOCTYPE html><html><body>
<iframe id="page" src="{src}" width="1200" height="900"></iframe><pre id="result">pending</pre>
<script>
document.getElementById("page").addEventListener("load", () => {{
  const out = [];
  for (const i of document.getElementById("page").contentDocument.images) {{
    let ink = -1;
    if (i.naturalWidth > 0) {{
      const c = document.createElement("canvas");
      c.width = i.naturalWidth; c.height = i.naturalHeight;
      const g = c.getContext("2d");
      g.drawImage(i, 0, 0);
      const px = g.getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let k = 0; k < px.length; k += 4) if (px[k + 3] > 0 && px[k] + px[k + 1] + px[k + 2] < 700) n++;
      ink = n / (c.width * c.height);
    }}
    out.push({{alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight, ink: ink}});
  }}
  document.getElementById("result").textContent = JSON.stringify(out);
}});
</script></body></html>
"""


def decoded_images(tmp_path, page: Path):
    """What the browser decoded of each <img> of `page`: alt, complete, natural width and height,
    ink (the share of pixels that are not white; -1 where nothing decoded).
    The page holds no script: a test-only harness loads it in an iframe and reads its images
    (--allow-file-access-from-files lets the harness see into a file:// frame)."""
    import json

    harness = Path(tmp_path) / f"harness-{page.parent.name}.html"
    harness.write_text(IMAGE_HARNESS.format(src=page.resolve().as_uri()))
    dom = dump_dom(tmp_path, harness, "--allow-file-access-from-files", "--virtual-time-budget=10000")
    result = dom.text("result")
    assert result != "pending", "the harness did not see the page load"
    return json.loads(result)
