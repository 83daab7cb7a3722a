"""loom.train and loom.distributed: training from Python, alone and data-parallel under
mpirun (docs/distributed.md)."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loom


def small(**kw):
    args = dict(hidden=[32], epochs=1, batch=32, max_steps_per_epoch=8, examples=1000,
                threads=1, optimizer="sgd", lr=0.05, seed=5)
    args.update(kw)
    return loom.train(**args)


def test_world_of_one_process():
    w = loom.distributed.world()
    assert (w.rank, w.size, w.backend) == (0, 1, "mpi")
    assert not loom.distributed.launched_with_peers()
    w.barrier()
    w.timeout = 12.5
    assert w.timeout == 12.5
    with pytest.raises(ValueError):
        w.timeout = -1
    assert w.checked
    w.checked = False
    w.barrier()
    w.checked = True
    assert w.checked


def test_train_reports_and_one_rank_is_one_process():
    alone = small()
    together = small(communicator=loom.distributed.world())
    assert alone["steps"] == 8 and alone["ranks"] == 1 and together["ranks"] == 1
    assert alone["epochs"][0]["loss"] == together["epochs"][0]["loss"]
    assert 0 <= alone["test_accuracy"] <= 1


def test_train_on_numpy_arrays_learns_a_separable_problem():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    steps = []
    r = loom.train(features=x, labels=y, test_features=x[:128], test_labels=y[:128],
                   hidden=[16], epochs=20, batch=32, lr=0.01, threads=1,
                   progress=lambda p: steps.append(p["step"]))
    assert r["test_accuracy"] > 0.9
    assert len(steps) == 20 * (512 // 32)


def test_bad_input_is_named():
    x = np.zeros((10, 3), np.float32)
    with pytest.raises(ValueError, match="labels: one per example"):
        loom.train(features=x, labels=np.zeros(9, np.int64))
    with pytest.raises(ValueError, match="example 2 has the label -1"):
        loom.train(features=x, labels=np.array([0, 1, -1, 0, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="features and labels go together"):
        loom.train(features=x)
    with pytest.raises(ValueError, match="bucket_mb"):
        small(bucket_mb=0)
    with pytest.raises(ValueError, match="batch 2000 is more|fewer than a batch"):
        small(batch=2000)
    assert issubclass(loom.distributed.DistributedError, RuntimeError)


JOB = textwrap.dedent("""
    import sys
    import loom
    w = loom.distributed.world()
    args = dict(hidden=[32], epochs=2, batch=32, max_steps_per_epoch=6, examples=1000,
                threads=1, optimizer="sgd", lr=0.05, seed=5, bucket_mb=0.01)
    dp = loom.train(communicator=w, **args)
    one = loom.train(**args)
    try:
        loom.train(communicator=w, **dict(args, batch=33))
        bad = "trained"
    except ValueError as e:
        bad = "does not split over" in str(e) and f"rank {w.rank}" in str(e)
    # A file a rank: mpirun may interleave the ranks' stdout mid-line.
    with open(f"{sys.argv[1]}/rank{w.rank}.txt", "w") as f:
        f.write(f"rank {w.rank} of {w.size}: ranks {dp['ranks']} buckets {dp['buckets']} "
                f"loss {abs(dp['epochs'][1]['loss'] - one['epochs'][1]['loss']):.3g} "
                f"comm {dp['communication_seconds'] > 0} bad-batch {bad}\\n")
""")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (openmpi-bin)")
def test_data_parallel_under_mpirun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    out = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, str(script), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(p.read_text().strip() for p in tmp_path.glob("rank*.txt"))
    assert len(lines) == 2, out.stdout + out.stderr
    for r, line in enumerate(lines):
        words = line.split()
        assert words[:4] == ["rank", str(r), "of", "2:"], line
        assert words[5] == "2" and int(words[7]) >= 2, line  # 2 ranks, several buckets
        assert float(words[9]) < 1e-5, line  # the global batch's loss: one process's
        assert words[11] == "True" and words[13] == "True", line


def test_collectives_added_through_graph_op_are_chained_in_order():
    # Note [collective order]: however a collective is added, it waits for the previous one.
    import json
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [4])
    a = g.op("all_reduce", [x], reduction="sum", name="a")
    b = g.op("all_reduce", [x], reduction="max", name="b")
    c = g.op("broadcast", [x], root=0, name="c")
    nodes = {n["name"]: n for n in json.loads(g.to_json(0))["nodes"]}
    assert "^a" in nodes["b"]["inputs"] and "^b" in nodes["c"]["inputs"]
    assert not any(i.startswith("^") for i in nodes["a"]["inputs"])
    s = loom.Session(g)
    for v in s.run([a, b, c], {x: np.arange(4, dtype=np.float32)}):
        assert np.asarray(v).tolist() == [0, 1, 2, 3]
