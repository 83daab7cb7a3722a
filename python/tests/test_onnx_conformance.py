"""ONNX's backend node tests on loom (tests/onnx/conformance.py). Cases that use an ONNX op
outside loom.onnx.supported_ops() are skipped by op name; every other case must pass, except
those named in tests/onnx/expected_failures.json, the ledger of cases of claimed ops that
loom does not pass yet, which only shrinks (a listed case that passes fails this test: take
it out, or rewrite the ledger with conformance.py --write-expected-failures). The cases are
generated from python3-onnx's case generators into a temporary directory.
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

ONNX_TESTS = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "onnx")
SCRIPT = os.path.join(ONNX_TESTS, "conformance.py")
LEDGER = os.path.join(ONNX_TESTS, "expected_failures.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("onnx_conformance")
    report = tmp / "conformance.json"
    r = subprocess.run([sys.executable, SCRIPT, "--data-dir", str(tmp / "data"),
                        "--json", str(report), "--expected-failures", LEDGER],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert report.exists(), r.stderr[-4000:]
    return r, json.loads(report.read_text())


def test_claimed_ops_pass_but_for_the_ledger(run):
    r, result = run
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert result["totals"]["pass"] > 0


def test_skips_name_only_unclaimed_ops_and_missing_dtypes(run):
    # A case is skipped only for ops loom does not claim, named, or for data types loom has
    # no dtype for, named.
    _, result = run
    claimed = set(result["supported_ops"])
    lacking = {"UINT16", "UINT32", "UINT64", "INT16", "STRING", "COMPLEX64", "COMPLEX128",
               "BFLOAT16", "SEQUENCE", "OPTIONAL", "MAP", "SPARSE_TENSOR"}
    skipped = 0
    for counts in result["ops"].values():
        for outcome in counts["cases"].values():
            if outcome[0] == "skip":
                skipped += 1
                named = outcome[1].split(": ", 1)[1].split(", ")
                if outcome[1].startswith("unsupported ONNX op"):
                    assert named and not claimed & set(named)
                else:
                    assert outcome[1].startswith("ONNX data type")
                    assert named and set(named) <= lacking
    assert skipped == result["totals"]["skip"]


def test_ledger_names_cases_of_the_suite(run):
    # Every ledger entry is a case the suite ran, under the op the ledger says.
    _, result = run
    with open(LEDGER) as f:
        ledger = json.load(f)
    for case, entry in ledger.items():
        assert case in result["ops"].get(entry["op"], {}).get("cases", {}), case
