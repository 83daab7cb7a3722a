"""The memory report pages (loom memreplay --html, loom train --memory-report), opened in a
real browser: Debian's chromium, headless. The page must load without a script error and
draw its charts (lines with their points, the chunk map, the sites table); its data must be
the replay's own (checked against `loom memreplay --json`); a failing replay marks its first
failure; a screenshot shows more than a blank page."""
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOM = os.environ.get("LOOM_TOOL", str(ROOT / "build" / "loom"))
LOG = str(ROOT / "data" / "mlp_training.alloc.csv")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(not Path(LOOM).exists(), reason=f"no loom tool at {LOOM}"),
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/install-deps.sh installs it)"),
]


def browser(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", *args],
                          capture_output=True, text=True, timeout=120)


def rendered(page):
    """The DOM after the page's script ran."""
    out = browser("--dump-dom", page.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def data_of(page):
    text = page.read_text()
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def check_drawn(dom):
    assert 'data-drawn="usage frag map sites"' in dom, dom[:3000]
    assert "data-errors" not in dom
    assert re.search(r'<pre id="errors"></pre>', dom)
    lines = re.findall(r'<polyline [^>]*data-points="(\d+)"', dom)
    assert len(lines) == 4  # in use, reserved, largest free block; fragmentation
    return lines


def png_colours(path):
    """How many distinct byte values the decoded image rows hold (a blank page: a few)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


def test_a_replay_report_draws_the_replay(tmp_path):
    page = tmp_path / "report.html"
    run = subprocess.run([LOOM, "memreplay", LOG, "--html", str(page), "--quiet"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(subprocess.run([LOOM, "memreplay", LOG, "--json", "--quiet"],
                                       capture_output=True, text=True, check=True).stdout)["report"]
    data = data_of(page)
    assert data["peak_bytes_in_use"] == report["peak_bytes_in_use"]
    assert data["peak_event"] == report["peak_in_use_event"]
    assert data["failure"] is None and data["at_event"] == report["peak_in_use_event"]
    # At the peak, the blocks the map colours hold exactly the bytes in use then.
    assert sum(s["bytes"] for s in data["sites"]) == report["peak_bytes_in_use"]
    assert {"mlp/eval", "adam/step"} <= {s["tag"] for s in data["sites"]}
    dom = rendered(page)
    points = check_drawn(dom)
    assert all(int(p) >= 100 for p in points)
    chunks = sum(len(r["chunks"]) for r in data["regions"])
    assert chunks >= 10 and len(re.findall(r"<rect ", dom)) >= chunks
    assert len(re.findall(r"<tr>", dom)) >= 1 + len(data["sites"])
    shot = tmp_path / "report.png"
    out = browser("--screenshot=" + str(shot), "--window-size=1200,1400", page.as_uri())
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    assert png_colours(shot) > 50


def test_a_failing_replay_marks_its_first_failure(tmp_path):
    page = tmp_path / "failed.html"
    run = subprocess.run([LOOM, "memreplay", LOG, "--pool", "fixed", "--initial-size", "8MiB",
                          "--html", str(page), "--quiet"], capture_output=True, text=True)
    assert run.returncode != 0 and page.exists()
    data = data_of(page)
    assert data["failure"] is not None and data["at_failure"]
    assert data["at_event"] == data["failure"]["event"] == data["events_replayed"] - 1
    dom = rendered(page)
    check_drawn(dom)
    assert "first failure" in dom and "The replay failed at event" in dom


def test_a_training_report_names_the_nodes_that_hold_memory(tmp_path):
    page = tmp_path / "train.html"
    run = subprocess.run([LOOM, "train", "--epochs", "1", "--examples", "2000", "--quiet",
                          "--memory-report", str(page)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    data = data_of(page)
    tags = {s["tag"] for s in data["sites"]}
    assert len(tags) >= 5 and any("fused_adam" in t for t in tags), tags
    check_drawn(rendered(page))


@pytest.mark.parametrize("command", [["memreplay", LOG, "--html"],
                                     ["train", "--epochs", "1", "--memory-report"]])
def test_an_unwritable_report_fails_before_any_work(command):
    run = subprocess.run([LOOM, *command, "/nonexistent-folder/report.html"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "cannot write the memory report to '/nonexistent-folder/report.html'" in run.stderr
    assert "epoch" not in run.stdout and "events" not in run.stdout
