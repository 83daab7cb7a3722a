"""The robustness catalogue's process-level half (Note [the robustness catalogue],
tests/robustness/inputs_test.cpp): the `loom` tool given bad files and options, the Python
package given bad graphs, feeds and foreign objects, and faults: `kill -9` during a save.

Every case asserts that loom never dies of a signal (no abort, no "terminate called"), exits
with its documented status (2 for bad usage or input that does not parse, 1 for a failure
at run time), names what was wrong, and, in Python, leaves the process and the session
usable with cpu:0's pool back where it was.

Run with PYTHONPATH=<build>/python and LOOM_TOOL=<build>/loom (ctest does).
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import loom

TOOL = os.environ.get("LOOM_TOOL", "build/loom")

# ---- the command-line tool ------------------------------------------------------------------

GRAPH = {
    "format": "loom.graph", "version": 1,
    "nodes": [
        {"name": "x", "op": "placeholder",
         "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [-1, 3]}}},
        {"name": "y", "op": "relu", "inputs": ["x"], "attrs": {"T": {"dtype": "float32"}}},
    ],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")

    def put(name, data):
        p = d / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(p)

    f = {"dir": str(d), "missing": str(d / "missing.file")}
    f["graph"] = put("graph.json", json.dumps(GRAPH))
    f["graph_garbage"] = put("garbage.json", b"\x00\x01{{{not json")
    f["graph_empty"] = put("empty.json", "")
    bad = json.loads(json.dumps(GRAPH))
    bad["nodes"][1]["op"] = "frobnicate"
    f["graph_unknown_op"] = put("unknown_op.json", json.dumps(bad))
    bad = json.loads(json.dumps(GRAPH))
    bad["nodes"][1]["inputs"] = ["x", "x"]
    f["graph_two_inputs"] = put("two_inputs.json", json.dumps(bad))
    bad = json.loads(json.dumps(GRAPH))
    bad["nodes"][0]["attrs"]["shape"]["shape"] = [-7, 3]
    f["graph_bad_shape"] = put("bad_shape.json", json.dumps(bad))
    good = d / "x.npy"
    np.save(good, np.arange(6, dtype=np.float32).reshape(2, 3))
    f["npy"] = str(good)
    np.save(d / "x64.npy", np.arange(6, dtype=np.float64).reshape(2, 3))
    f["npy_f64"] = str(d / "x64.npy")
    np.save(d / "x1d.npy", np.arange(3, dtype=np.float32))
    f["npy_1d"] = str(d / "x1d.npy")
    f["npy_garbage"] = put("garbage.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 'zz'}")
    f["npy_truncated"] = put("truncated.npy", good.read_bytes()[:-5])
    f["csv_header_only"] = put("header_only.csv", "label,a,b\n")
    f["csv_text"] = put("text.csv", "0,1,2\n1,x,3\n")
    f["csv_ragged"] = put("ragged.csv", "0,1,2\n1,2\n")
    f["csv_negative"] = put("negative.csv", "0,1,2\n-3,2,3\n")
    f["log_garbage"] = put("garbage.log", "not,a,log\n")
    f["log_bad_line"] = put("bad_line.log",
                            "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n"
                            "0,0,1,allocate,0x10,sixty,64,0x0,t,ok\n")
    f["regular_file"] = put("a_regular_file", "x")
    return f


# (id, argv with {placeholders} from `files`, exit status, parts of stderr)
CLI_CASES = [
    ("no_subcommand", [], 2, []),
    ("unknown_subcommand", ["frobnicate"], 2, ["unknown subcommand 'frobnicate'", "train"]),
    ("run_missing_graph", ["run", "{missing}"], 2, ["missing.file", "does not exist"]),
    ("run_graph_is_directory", ["run", "{dir}"], 2, ["is actually a directory"]),
    ("run_graph_garbage", ["run", "{graph_garbage}", "--fetch", "y"], 2, ["garbage.json"]),
    ("run_graph_empty", ["run", "{graph_empty}", "--fetch", "y"], 2, ["empty.json"]),
    ("run_graph_unknown_op", ["run", "{graph_unknown_op}", "--fetch", "y"], 1, ["frobnicate"]),
    ("run_graph_wrong_inputs", ["run", "{graph_two_inputs}", "--fetch", "y"], 1, ["'y'", "expects 1 input"]),
    ("run_graph_bad_shape", ["run", "{graph_bad_shape}", "--fetch", "y"], 1, ["'x'", "dimension 0 is -7"]),
    ("run_feed_without_equals", ["run", "{graph}", "--feed", "x", "--fetch", "y"], 2, ["x"]),
    ("run_feed_missing_file", ["run", "{graph}", "--feed", "x={missing}", "--fetch", "y"], 2,
     ["missing.file"]),
    ("run_feed_is_directory", ["run", "{graph}", "--feed", "x={dir}", "--fetch", "y"], 2,
     ["is a directory"]),
    ("run_feed_garbage", ["run", "{graph}", "--feed", "x={npy_garbage}", "--fetch", "y"], 2,
     ["garbage.npy"]),
    ("run_feed_truncated", ["run", "{graph}", "--feed", "x={npy_truncated}", "--fetch", "y"], 2,
     ["truncated.npy"]),
    ("run_feed_wrong_dtype", ["run", "{graph}", "--feed", "x={npy_f64}", "--fetch", "y"], 1,
     ["'x'", "float64"]),
    ("run_feed_wrong_rank", ["run", "{graph}", "--feed", "x={npy_1d}", "--fetch", "y"], 1,
     ["'x'", "[3]"]),
    ("run_feed_unknown_node", ["run", "{graph}", "--feed", "z={npy}", "--fetch", "y"], 1, ["'z'"]),
    ("run_missing_feed", ["run", "{graph}", "--fetch", "y"], 1, ["'x'"]),
    ("run_fetch_unknown", ["run", "{graph}", "--feed", "x={npy}", "--fetch", "nope"], 1,
     ["'nope'"]),
    ("run_fetch_index_not_a_number", ["run", "{graph}", "--feed", "x={npy}", "--fetch", "y:one"],
     2, ["'y:one'"]),
    ("run_fetch_index_past_outputs", ["run", "{graph}", "--feed", "x={npy}", "--fetch", "y:3"], 1,
     ["'y:3'"]),
    ("run_output_dir_under_a_file",
     ["run", "{graph}", "--feed", "x={npy}", "--fetch", "y", "-o", "{regular_file}/out"], 2,
     ["a_regular_file"]),
    ("run_trace_into_missing_dir",
     ["run", "{graph}", "--feed", "x={npy}", "--fetch", "y", "--trace", "{missing}/t.json"], 2,
     ["missing.file"]),
    ("run_repeat_zero", ["run", "{graph}", "--repeat", "0"], 2, ["repeat"]),
    ("run_virtual_cpus_huge", ["run", "{graph}", "--virtual-cpus", "99999"], 2,
     ["virtual-cpus"]),
    ("run_disable_unknown_pass", ["run", "{graph}", "--disable-pass", "magic"], 2, ["magic"]),
    ("memreplay_missing_log", ["memreplay", "{missing}"], 2, ["missing.file"]),
    ("memreplay_log_is_directory", ["memreplay", "{dir}"], 2, []),
    ("memreplay_garbage_log", ["memreplay", "--quiet", "{log_garbage}"], 2, ["garbage.log:1"]),
    ("memreplay_bad_number", ["memreplay", "--quiet", "{log_bad_line}"], 2, ["bad_line.log:2", "sixty"]),
    ("memreplay_bad_pool", ["memreplay", "--pool", "huge", "{log_garbage}"], 2, ["huge"]),
    ("memreplay_bad_size", ["memreplay", "--initial-size", "lots", "{log_garbage}"], 2,
     ["lots"]),
    ("memreplay_html_under_a_file",
     ["memreplay", "--quiet", "--html", "{regular_file}/r.html", "{log_bad_line}"], 2,
     ["a_regular_file"]),
    ("train_missing_data", ["train", "--quiet", "--data", "{missing}"], 2, ["missing.file"]),
    ("train_data_is_directory", ["train", "--quiet", "--data", "{dir}"], 2,
     ["is actually a directory"]),
    ("train_data_header_only", ["train", "--quiet", "--data", "{csv_header_only}"], 2,
     ["header_only.csv"]),
    ("train_data_not_numbers", ["train", "--quiet", "--data", "{csv_text}"], 2, ["text.csv:2"]),
    ("train_data_ragged", ["train", "--quiet", "--data", "{csv_ragged}"], 2, ["ragged.csv:2"]),
    ("train_data_negative_label", ["train", "--quiet", "--data", "{csv_negative}"], 2,
     ["negative.csv:2"]),
    ("train_unknown_model", ["train", "--model", "transformer"], 2, ["transformer"]),
    ("train_negative_epochs", ["train", "--epochs", "-1"], 2, ["epochs"]),
    ("train_zero_batch", ["train", "--batch", "0"], 2, ["batch"]),
    ("train_lr_not_a_number", ["train", "--lr", "fast"], 2, ["lr"]),
    ("train_lr_negative", ["train", "--lr", "-0.1"], 2, ["lr"]),
    ("train_unknown_optimizer", ["train", "--optimizer", "lion"], 2, ["lion"]),
    ("train_trace_under_a_file",
     ["train", "--quiet", "--epochs", "1", "--examples", "20", "--trace", "{regular_file}/t.json"],
     2, ["a_regular_file"]),
    ("train_report_under_a_file",
     ["train", "--quiet", "--epochs", "1", "--examples", "20", "--memory-report",
      "{regular_file}/r.html"], 2, ["a_regular_file"]),
    ("devices_unknown_option", ["devices", "--colour"], 2, ["colour"]),
    ("bench_unknown_suite", ["bench", "frobnicate"], 2, ["subcommand"]),
]


@pytest.mark.parametrize("name,argv,status,parts", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli(files, name, argv, status, parts):
    args = [a.format(**files) for a in argv]
    # From the scratch folder: whatever a case writes (fetched .npy files) stays there.
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=300,
                       errors="replace", cwd=files["dir"])
    out = r.stdout + r.stderr
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {out[-2000:]}"
    assert "terminate called" not in out and "Aborted" not in out, out[-2000:]
    assert r.returncode == status, f"exit status {r.returncode}, expected {status}: {out[-2000:]}"
    for part in parts:
        assert part.format(**files) in out, f"{part!r} not in: {out[-2000:]}"


# ---- the Python package ---------------------------------------------------------------------

def cpu_bytes():
    return loom.memory.stats("cpu:0")["pool"]["bytes_in_use"]


def small_session():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [None, 3])
    y = loom.ops.relu(x * 2.0)
    return g, x, y, loom.Session(g)


def still_usable(s, x, y):
    out = np.asarray(s.run(y, {x: np.array([[1, -2, 3]], np.float32)}))
    np.testing.assert_array_equal(out, np.array([[2, 0, 6]], np.float32))


# (id, exception type(s), parts of the message, action(g, x, y, s))
PY_CASES = [
    ("graph_from_json_garbage", ValueError, ["graph json"], lambda g, x, y, s: loom.Graph.from_json("{{")),
    ("graph_from_json_not_a_str", TypeError, [], lambda g, x, y, s: loom.Graph.from_json(42)),
    ("graph_from_json_unknown_op", LookupError, ["frobnicate"],
     lambda g, x, y, s: loom.Graph.from_json(json.dumps(
         {**GRAPH, "nodes": [GRAPH["nodes"][0], {**GRAPH["nodes"][1], "op": "frobnicate"}]}))),
    ("placeholder_bad_dtype", TypeError, ["complex128"],
     lambda g, x, y, s: g.placeholder("p", "complex128", [2])),
    ("placeholder_shape_not_sequence", TypeError, ["shape"], lambda g, x, y, s: g.placeholder("p", loom.float32, 3)),
    ("placeholder_dim_below_minus_one", ValueError, ["dimension 0 is -3"],
     lambda g, x, y, s: g.placeholder("p", loom.float32, [-3])),
    ("placeholder_dim_float", TypeError, ["dimension 0", "float"],
     lambda g, x, y, s: g.placeholder("p", loom.float32, [2.5])),
    ("placeholder_dim_str", TypeError, ["dimension 1", "str"],
     lambda g, x, y, s: g.placeholder("p", loom.float32, [2, "3"])),
    ("placeholder_dim_huge", OverflowError, ["dimension 0", "64-bit"],
     lambda g, x, y, s: g.placeholder("p", loom.float32, [2 ** 70])),
    ("placeholder_product_overflows", ValueError, ["2^63"],
     lambda g, x, y, s: g.placeholder("p", loom.float32, [2 ** 62, 2 ** 62])),
    ("placeholder_name_with_colon", ValueError, ["':'"], lambda g, x, y, s: g.placeholder("p:1", loom.float32, [1])),
    ("placeholder_name_taken", ValueError, ["already exists"], lambda g, x, y, s: g.placeholder("x", loom.float32, [1])),
    ("op_unknown", LookupError, ["frobnicate"], lambda g, x, y, s: g.op("frobnicate", [x])),
    ("op_unknown_attr", TypeError, ["colour"], lambda g, x, y, s: g.op("relu", [x], colour=3)),
    ("op_wrong_input_count", ValueError, ["expects 1 input"], lambda g, x, y, s: g.op("relu", [x, x])),
    ("matmul_shapes_disagree", ValueError, ["matmul"],
     lambda g, x, y, s: loom.ops.matmul(x, g.placeholder("w", loom.float32, [4, 2]))),
    ("output_unknown_node", KeyError, ["nope"], lambda g, x, y, s: g.output("nope")),
    ("run_feed_wrong_dtype", ValueError, ["'x'", "float64"],
     lambda g, x, y, s: s.run(y, {x: np.ones((1, 3), np.float64)})),
    ("run_feed_wrong_shape", ValueError, ["'x'"], lambda g, x, y, s: s.run(y, {x: np.ones((1, 4), np.float32)})),
    ("run_feed_unknown_name", KeyError, ["'zz'"],
     lambda g, x, y, s: s.run(y, {x: np.ones((1, 3), np.float32), "zz": np.ones(1)})),
    ("run_missing_feed", ValueError, ["'x'"], lambda g, x, y, s: s.run(y)),
    ("run_fetch_unknown", KeyError, ["'nope'"], lambda g, x, y, s: s.run("nope", {x: np.ones((1, 3), np.float32)})),
    ("run_fetch_not_a_name", TypeError, [], lambda g, x, y, s: s.run(3.5, {x: np.ones((1, 3), np.float32)})),
    ("run_feed_object_array", (TypeError, ValueError), ["'x'"],
     lambda g, x, y, s: s.run(y, {x: np.array([[object(), 1, 2]], dtype=object)})),
    ("run_feed_string", (TypeError, ValueError), ["'x'"], lambda g, x, y, s: s.run(y, {x: "hello"})),
    ("from_numpy_object_array", TypeError, ["object"], lambda g, x, y, s: loom.from_numpy(np.array([object()]))),
    ("from_numpy_complex", TypeError, ["complex"], lambda g, x, y, s: loom.from_numpy(np.ones(2, np.complex64))),
    ("from_dlpack_not_an_array", (TypeError, BufferError), [], lambda g, x, y, s: loom.from_dlpack(object())),
    ("from_arrow_not_arrow", (TypeError, ValueError), [], lambda g, x, y, s: loom.from_arrow(object())),
    ("tensor_ragged_list", ValueError, [], lambda g, x, y, s: loom.tensor([[1, 2], [3]])),
]


@pytest.mark.parametrize("name,exc,parts,act", PY_CASES, ids=[c[0] for c in PY_CASES])
def test_python(name, exc, parts, act):
    g, x, y, s = small_session()
    still_usable(s, x, y)
    before = cpu_bytes()
    with pytest.raises(exc) as info:
        act(g, x, y, s)
    for part in parts:
        assert part in str(info.value), f"{part!r} not in: {info.value}"
    del info
    still_usable(s, x, y)
    assert cpu_bytes() <= before, "cpu:0 holds more bytes than before the case"


# ---- faults: kill -9 during a checkpoint save -----------------------------------------------

def test_kill_9_during_training_checkpoints_keeps_a_loadable_checkpoint(tmp_path):
    """`loom train --checkpoint` killed at random moments never leaves a checkpoint that does
    not load: each restart resumes from the last complete save (or from scratch), and the
    temporary files of killed saves are gone after it."""
    ckpt = tmp_path / "ckpt"
    rng = np.random.default_rng(7)
    for attempt in range(6):
        p = subprocess.Popen([TOOL, "train", "--quiet", "--epochs", "50", "--examples", "400",
                              "--checkpoint", str(ckpt), "--resume"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
        time.sleep(float(rng.uniform(0.3, 1.5)))
        p.send_signal(signal.SIGKILL)
        p.communicate()
    r = subprocess.run([TOOL, "train", "--quiet", "--epochs", "1", "--examples", "400",
                        "--checkpoint", str(ckpt), "--resume"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    left = sorted(p.name for p in ckpt.iterdir())
    assert left == ["checkpoint.safetensors"], left


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
