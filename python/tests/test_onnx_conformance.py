"""ONNX's backend node tests on loom (tests/onnx/conformance.py): every case of every ONNX op
that loom.onnx.supported_ops() claims must pass; cases that use other ops are skipped by op
name. The cases are generated from python3-onnx's case generators into a temporary directory.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("onnx")
lo = pytest.importorskip("loom.onnx")
if not hasattr(lo, "supported_ops"):
    pytest.skip("loom.onnx has no supported_ops()", allow_module_level=True)

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "onnx", "conformance.py")


def test_every_case_of_a_claimed_op_passes(tmp_path):
    report = tmp_path / "conformance.json"
    r = subprocess.run([sys.executable, SCRIPT, "--data-dir", str(tmp_path / "data"),
                        "--json", str(report)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert report.exists(), r.stderr[-4000:]
    result = json.loads(report.read_text())
    failed = {op: [c for c, v in counts["cases"].items() if v[0] == "fail"]
              for op, counts in result["ops"].items() if counts["fail"]}
    assert not failed, r.stdout[-6000:]
    assert r.returncode == 0, r.stderr[-4000:]
    assert result["totals"]["pass"] > 0
    # A skipped case names the ops loom lacks, none of which loom claims.
    claimed = set(result["supported_ops"])
    for counts in result["ops"].values():
        for outcome in counts["cases"].values():
            if outcome[0] == "skip":
                assert outcome[1].startswith("unsupported ONNX op")
                missing = outcome[1].split(": ", 1)[1].split(", ")
                assert not claimed & set(missing)
