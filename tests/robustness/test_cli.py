"""The `loom` tool under bad input: every case ends with a documented exit status (docs/cli.md:
1 the work failed, 2 bad usage or input that does not parse), never with a signal, never with
"terminate called", and with a message that names what was wrong. Cases that must fail before
any work also show no training output."""
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOM = os.environ.get("LOOM_TOOL", str(ROOT / "build" / "loom"))
LOG = str(ROOT / "data" / "mlp_training.alloc.csv")

pytestmark = pytest.mark.skipif(not Path(LOOM).exists(), reason=f"no loom tool at {LOOM}")

# A small run of the embedded dataset: a second or so.
SMALL = ["--examples", "200", "--quiet"]

GRAPH = {"format": "loom.graph", "version": 1, "nodes": [
    {"name": "x", "op": "placeholder", "inputs": [],
     "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2, 3]}}},
    {"name": "relu", "op": "relu", "inputs": ["x"], "attrs": {"T": {"dtype": "float32"}}}]}


def loom(*args, cwd=None, stdout=subprocess.PIPE):
    return subprocess.run([LOOM, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=300, cwd=cwd)


def check(run, status, *parts, before_work=False):
    """The run ended with `status` (not a signal), saying each of `parts` on stderr."""
    assert run.returncode >= 0, f"killed by signal {-run.returncode}:\n{run.stderr}"
    assert "terminate called" not in run.stderr, run.stderr
    assert run.returncode == status, f"exit {run.returncode}, not {status}:\n{run.stderr}"
    for part in parts:
        assert part in run.stderr, f"{part!r} not in:\n{run.stderr}"
    if before_work:
        assert "epoch" not in (run.stdout or ""), run.stdout


@pytest.fixture
def files(tmp_path):
    """Inputs for the cases: CSV files, a graph, .npy feeds, a plain file."""
    f = {}

    def write(name, text):
        p = tmp_path / name
        p.write_text(text)
        f[name] = p
        return p

    write("a_file", "x")
    write("nan.csv", "label,a,b\n" + "".join(
        f"{i % 2},{i},{'nan' if i == 17 else 1}\n" for i in range(60)))
    write("somenan.csv", "".join(f"{i % 2},{i},{'nan' if i % 5 == 0 else 1}\n" for i in range(60)))
    write("allnan.csv", "".join(f"{i % 2},{i},nan\n" for i in range(60)))
    write("good.csv", "label,a,b\n" + "".join(f"{i % 3},{i % 7},{i % 5}\n" for i in range(60)))
    write("badlabel.csv", "1,0.5,1\nx,1,1\n0,1,2\n")
    write("twoheaders.csv", "label,a\nlabel,a\n1,2\n")
    write("huge.csv", "1,2,3\n0,4,5\n999999,6,7\n")
    write("negative.csv", "1,2,3\n-1,4,5\n")
    write("fraction.csv", "1,2,3\n2.5,4,5\n")
    write("five.csv", "1,2,3\n5,4,5\n")
    write("columns.csv", "1,2,3\n0,4\n")
    write("feature.csv", "1,2,3\n0,4,x\n")
    write("header.csv", "label,a,b\n")
    write("empty.csv", "")
    write("graph.json", json.dumps(GRAPH))
    write("truncated.json", json.dumps(GRAPH)[:40])
    write("bad.log", "# loom allocation log v1\n"
                     "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n"
                     "0,0,1,allocate,0x10,abc,64,0x0,t,ok\n")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    f["x.npy"] = tmp_path / "x.npy"
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{garbage")
    f["bad.npy"] = tmp_path / "bad.npy"
    f["dir"] = tmp_path
    return f


# ---- loom: the command line itself -----------------------------------------------------------

@pytest.mark.parametrize("args,status,part", [
    ([], 2, "A subcommand is required"),
    (["fly"], 2, "unknown subcommand 'fly'"),
    (["train", "--bogus"], 2, "--bogus"),
    (["train", "--epochs", "-1"], 2, "--epochs"),
    (["train", "--epochs", "0"], 2, "--epochs"),
    (["train", "--epochs", "1e9"], 2, "--epochs"),
    (["train", "--batch", "0"], 2, "--batch"),
    (["train", "--batch", "99999999999999"], 2, "--batch"),
    (["train", "--lr", "nan"], 2, "--lr: nan is not a finite number > 0"),
    (["train", "--lr", "inf"], 2, "--lr: inf is not a finite number > 0"),
    (["train", "--lr", "-0.1"], 2, "--lr: -0.1 is not a finite number > 0"),
    (["train", "--lr", "0"], 2, "--lr: 0 is not a finite number > 0"),
    (["train", "--lr", "fast"], 2, "--lr: 'fast' is not a number"),
    (["train", "--threads", "100000"], 2, "--threads"),
    (["train", "--threads", "-1"], 2, "--threads"),
    (["train", "--devices", "0"], 2, "--devices"),
    (["train", "--examples", "5"], 2, "--examples"),
    (["train", "--examples", "100000000"], 2, "--examples"),
    (["train", "--model", "transformer"], 2, "--model"),
    (["train", "--optimizer", "lion"], 2, "--optimizer"),
    (["train", "--seed", "abc"], 2, "--seed"),
    (["train", "--seed", "-1"], 2, "--seed"),
    (["bench", "memory", "--seed", "-1"], 2, "--seed"),
    (["train", "--resume"], 2, "--resume requires --checkpoint"),
    (["train", "--classes", "5"], 2, "--classes requires --data"),
    (["train", "--classes", "0"], 2, "--classes"),
    (["train", "--skip-nonfinite-steps", "--no-fused"], 2,
     "--skip-nonfinite-steps: needs the fused update"),
    (["run"], 2, "graph is required"),
    (["memreplay"], 2, "log is required"),
    (["bench"], 2, "A subcommand is required"),
    (["bench", "memory", "--repetitions", "0"], 2, "--repetitions"),
    (["bench", "train", "--threads", "0"], 2, "--threads"),
    (["bench", "train", "--only", "everything"], 2, "--only"),
    (["devices", "--threads", "5000"], 2, "--threads"),
    (["devices", "--virtual-cpus", "0"], 2, "--virtual-cpus"),
    (["devices", "--gpus", "-2"], 2, "--gpus"),
])
def test_bad_command_lines_are_usage_errors(args, status, part):
    check(loom(*args), status, part, before_work=True)


def test_help_is_not_an_error():
    run = loom("train", "--help")
    check(run, 0)
    for option in ("--allow-nonfinite", "--skip-nonfinite-steps", "--classes", "--resume"):
        assert option in run.stdout


def test_output_that_cannot_be_written_is_a_failure():
    with open("/dev/full", "w") as full:
        run = loom("devices", stdout=full)
    check(run, 1, "writing the standard output failed")


# ---- loom train ------------------------------------------------------------------------------

def test_output_paths_fail_before_any_work(files):
    under_file = files["a_file"] / "sub"
    check(loom("train", *SMALL, "--epochs", "1", "--checkpoint", under_file), 2,
          f"--checkpoint: checkpoint directory '{under_file}': '{files['a_file']}' is a file, "
          "not a directory", before_work=True)
    check(loom("train", *SMALL, "--checkpoint", "/proc/loom-checkpoints"), 2,
          "--checkpoint: checkpoint directory '/proc/loom-checkpoints': cannot create it: ",
          before_work=True)
    check(loom("train", *SMALL, "--trace", files["a_file"] / "t.json"), 2,
          f"--trace: trace file '{files['a_file'] / 't.json'}': '{files['a_file']}' is a file",
          before_work=True)
    check(loom("train", *SMALL, "--trace", files["dir"]), 2,
          f"--trace: trace file '{files['dir']}' is a directory", before_work=True)
    check(loom("train", *SMALL, "--memory-report", "/nonexistent-folder/report.html"), 2,
          "--memory-report: cannot write the memory report to '/nonexistent-folder/report.html'",
          before_work=True)


def test_a_batch_larger_than_the_data_is_a_usage_error():
    check(loom("train", *SMALL, "--epochs", "1", "--batch", "100000"), 2,
          "--batch: 100000 is more than the 167 training examples of digits", before_work=True)


@pytest.mark.parametrize("name,part", [
    ("badlabel.csv", "badlabel.csv:2: the label 'x' (column 1) is not a number"),
    ("twoheaders.csv", "twoheaders.csv:2: the label 'label' (column 1) is not a number"),
    ("huge.csv", "huge.csv:3: the label 999999 would make 1000000 classes, more than 10000"),
    ("negative.csv", "negative.csv:2: the label -1 is negative"),
    ("fraction.csv", "fraction.csv:2: the label 2.5 is not an integer"),
    ("columns.csv", "columns.csv:2: the row has 2 columns, but the first row (line 1) has 3"),
    ("feature.csv", "feature.csv:2: column 3 ('x') is not a number"),
    ("header.csv", "header.csv:1: a header but no data rows"),
    ("empty.csv", "empty.csv: no data rows (the file is empty)"),
])
def test_bad_csv_data_names_file_and_line(files, name, part):
    check(loom("train", "--data", files[name], "--epochs", "1", "--batch", "1", "--quiet"), 2, part,
          before_work=True)


def test_declared_classes_bound_the_labels(files):
    check(loom("train", "--data", files["five.csv"], "--classes", "5", "--batch", "1"), 2,
          "five.csv:2: the label 5 is not below the declared class count 5", before_work=True)
    run = loom("train", "--data", files["five.csv"], "--classes", "6", "--batch", "1", "--epochs",
               "1", "--quiet")
    check(run, 0)
    assert "6 classes" in run.stdout


def test_missing_or_directory_data_is_a_usage_error(files):
    check(loom("train", "--data", files["dir"]), 2, "--data: File is actually a directory")
    check(loom("train", "--data", files["dir"] / "none.csv"), 2, "--data: File does not exist")


def test_the_cnn_needs_images(files):
    check(loom("train", "--data", files["good.csv"], "--model", "cnn", "--batch", "4"), 2,
          "--model: cnn takes 1x28x28 images", before_work=True)


def test_nonfinite_features_are_refused_allowed_or_skipped(files):
    nan = files["nan.csv"]
    check(loom("train", "--data", nan, "--batch", "8", "--epochs", "1", "--quiet"), 1,
          f"{nan}:19: column 3 (feature 1) is nan", "--allow-nonfinite", before_work=True)
    # Allowed: the NaN rows (12 of 60, so some are in the training part) reach the gradients.
    some = files["somenan.csv"]
    stopped = loom("train", "--data", some, "--batch", "8", "--epochs", "1", "--quiet",
                   "--allow-nonfinite")
    check(stopped, 1, "epoch 1, step", "the fused update skipped the step; training stopped",
          "--skip-nonfinite-steps")
    skipped = loom("train", "--data", some, "--batch", "8", "--epochs", "2", "--quiet",
                   "--allow-nonfinite", "--skip-nonfinite-steps")
    check(skipped, 0)
    line = [l for l in skipped.stdout.splitlines() if "skipped steps" in l]
    assert line and int(line[0].split()[2]) > 0, skipped.stdout
    # Every step skipped: nothing was learned, and the summary says so.
    every = loom("train", "--data", files["allnan.csv"], "--batch", "8", "--epochs", "1",
                 "--quiet", "--allow-nonfinite", "--skip-nonfinite-steps")
    check(every, 0)
    # 50 training examples (one sixth is held out): 6 steps of 8.
    assert "skipped steps      6 " in every.stdout and "(6 steps skipped)" in every.stdout, \
        every.stdout


def test_a_nonfinite_loss_stops_training():
    check(loom("train", *SMALL, "--epochs", "1", "--batch", "16", "--lr", "1e30"), 1,
          "epoch 1, step 2 of 10", "training stopped")


# ---- checkpoints -----------------------------------------------------------------------------

def rewrite_metadata(path, **changes):
    """Rewrites a safetensors file's metadata (the tensors stay as they are)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["__metadata__"].update(changes)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


def test_resume_says_when_there_is_nothing_to_resume_from(tmp_path):
    ckpt = tmp_path / "ckpt"
    required = loom("train", *SMALL, "--epochs", "1", "--checkpoint", ckpt, "--resume=require")
    check(required, 1, f"nothing to resume from in '{ckpt}' (--resume=require)", before_work=True)
    assert not ckpt.exists()  # nothing was made
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume=sometimes"), 2, "--resume")
    fresh = loom("train", *SMALL, "--epochs", "1", "--checkpoint", ckpt, "--resume")
    check(fresh, 0, f"nothing to resume from in '{ckpt}': starting from scratch")
    assert (ckpt / "checkpoint.safetensors").exists()
    again = loom("train", *SMALL, "--checkpoint", ckpt, "--resume=require", "--epochs", "2")
    check(again, 0)
    assert "resumed after epoch 1" in again.stdout and "nothing to resume" not in again.stderr


@pytest.mark.parametrize("changes,status,part", [
    ({"epoch": "x"}, 2, "the epoch in checkpoint '{}': 'x' is not a non-negative integer"),
    ({"epoch": "-3"}, 2, "the epoch in checkpoint '{}': '-3' is not a non-negative integer"),
    ({"step": "lots"}, 2, "the step in checkpoint '{}': 'lots' is not a non-negative integer"),
    ({"optimizer": "sgd"}, 1, "checkpoint '{}' was written by a run with the sgd optimizer"),
    ({"model": "mlp 784-3-10"}, 1, "checkpoint '{}' holds the model mlp 784-3-10"),
])
def test_checkpoint_metadata_is_checked(tmp_path, changes, status, part):
    ckpt = tmp_path / "ckpt"
    check(loom("train", *SMALL, "--epochs", "1", "--checkpoint", ckpt), 0)
    path = ckpt / "checkpoint.safetensors"
    rewrite_metadata(path, **changes)
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume", "--epochs", "2"), status,
          part.format(path), before_work=True)


def test_a_damaged_checkpoint_is_named(tmp_path):
    ckpt = tmp_path / "ckpt"
    check(loom("train", *SMALL, "--epochs", "1", "--checkpoint", ckpt), 0)
    path = ckpt / "checkpoint.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume", "--epochs", "2"), 2, str(path),
          "truncated or corrupt", before_work=True)
    path.write_bytes(data[:8] + b"#" + data[9:])
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume", "--epochs", "2"), 2, str(path),
          "not valid JSON (at byte 8 of the file)", before_work=True)
    # Another model's weights: the model is told apart before a tensor is read.
    path.write_bytes(data)
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume", "--epochs", "2",
               "--model", "cnn"), 1, "holds the model mlp 784-512-512-10; this run builds cnn")


def test_resuming_removes_what_a_killed_save_left_and_nothing_else(tmp_path):
    ckpt = tmp_path / "ckpt"
    check(loom("train", *SMALL, "--epochs", "1", "--checkpoint", ckpt), 0)
    stale = ckpt / "checkpoint.safetensors.tmp-0123456789abcdef"
    stale.write_bytes(b"half a save")
    keep = [ckpt / "checkpoint.safetensors.tmp-notes", ckpt / "notes.txt"]
    for k in keep:
        k.write_text("keep")
    check(loom("train", *SMALL, "--checkpoint", ckpt, "--resume", "--epochs", "2"), 0)
    assert not stale.exists()
    assert all(k.exists() for k in keep)


# ---- loom run --------------------------------------------------------------------------------

def test_run_refuses_bad_graphs_feeds_and_names(files):
    g, x = files["graph.json"], files["x.npy"]
    cases = [
        (["run", files["dir"], "--fetch", "relu"], 2, "graph: File is actually a directory"),
        (["run", files["dir"] / "none.json", "--fetch", "relu"], 2, "graph: File does not exist"),
        (["run", files["truncated.json"], "--fetch", "relu"], 2, "graph json: line 1"),
        (["run", g, "--feed", f"x={files['bad.npy']}", "--fetch", "relu"], 2, "truncated header"),
        (["run", g, "--feed", f"x={files['a_file']}", "--fetch", "relu"], 2, "not a .npy file"),
        (["run", g, "--feed", f"x={files['dir'] / 'none.npy'}", "--fetch", "relu"], 2,
         "no such file or directory"),
        (["run", g, "--feed", str(x), "--fetch", "relu"], 2, "expected name=FILE.npy"),
        (["run", g, "--feed", f"x={x}", "--fetch", "relu:x"], 2,
         "--fetch: the output index of 'relu:x': 'x' is not an integer"),
        (["run", g, "--feed", f"x={x}", "--fetch", "relu:99999999999"], 2,
         "'99999999999' is not an integer in range"),
        (["run", g, "--feed", f"x={x}", "--fetch", "relu:-1"], 2, "-1 is negative"),
        (["run", g, "--feed", f"x={x}"], 2, "nothing to do: give at least one --fetch or --target"),
        (["run", g, "--feed", f"x={x}", "--fetch", "relu:5"], 1, "node 'relu' (relu) has 1 output"),
        (["run", g, "--feed", f"x={x}", "--fetch", "nothing"], 1, "no node named 'nothing'"),
        (["run", g, "--fetch", "relu"], 1, "placeholder 'x' (float32[2, 3]) needs a feed"),
        (["run", g, "--feed", f"x={x}", "--fetch", "relu", "--repeat", "0"], 2, "--repeat"),
    ]
    for args, status, part in cases:
        check(loom(*args, cwd=files["dir"]), status, part)


def test_run_checks_where_results_go_before_running(files):
    g, x = files["graph.json"], files["x.npy"]
    out = files["a_file"] / "out"
    check(loom("run", g, "--feed", f"x={x}", "--fetch", "relu", "-o", out), 2,
          f"--output-dir: output directory '{out}': '{files['a_file']}' is a file")
    check(loom("run", g, "--feed", f"x={x}", "--fetch", "relu", "-o", "/proc/loom-out"), 2,
          "--output-dir: output directory '/proc/loom-out': cannot create it")
    check(loom("run", g, "--feed", f"x={x}", "--fetch", "relu", "--trace", files["dir"]), 2,
          f"--trace: trace file '{files['dir']}' is a directory")
    run = loom("run", g, "--feed", f"x={x}", "--fetch", "relu", "-o", files["dir"] / "o")
    check(run, 0)
    assert np.array_equal(np.load(files["dir"] / "o" / "relu.npy"), np.ones((2, 3), np.float32))


# ---- loom memreplay --------------------------------------------------------------------------

def test_memreplay_refuses_bad_logs_and_configurations(files):
    cases = [
        (["memreplay", files["bad.log"], "--quiet"], 2, "bad.log:3: field 'bytes': 'abc'"),
        (["memreplay", files["dir"]], 2, "log: File is actually a directory"),
        (["memreplay", LOG, "--samples", "-1", "--quiet"], 2, "--samples"),
        (["memreplay", LOG, "--growth-step", "0", "--quiet"], 2,
         "--pool: bfc_pool 'memreplay': initial_size 0 with growth_step 0"),
        (["memreplay", LOG, "--granularity", "3", "--quiet"], 2,
         "--pool: bfc_pool 'memreplay': granularity 3 is not a power of two"),
        (["memreplay", LOG, "--limit", "-5", "--quiet"], 2, "--limit: '-5' is not a size"),
        (["memreplay", LOG, "--html", files["a_file"] / "r.html", "--quiet"], 2,
         "--html: cannot write the memory report"),
    ]
    for args, status, part in cases:
        check(loom(*args), status, part)
