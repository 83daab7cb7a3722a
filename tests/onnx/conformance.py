"""ONNX's backend node tests run on loom, with pass/fail/skip counts per ONNX op.

    PYTHONPATH=build/python /usr/bin/python3 tests/onnx/conformance.py
        [--data-dir build/onnx-backend-data] [--regenerate] [--op Relu --op Add ...]
        [--device CPU] [--json build/onnx-conformance.json] [--verbose]

The test cases come from ONNX's own case generators (onnx.backend.test.case, shipped by
Debian's python3-onnx without their data): the first run, or --regenerate, writes them with
onnx.backend.test.cmd_tools' generate_data into --data-dir (a build-tree directory; the
generated models are never committed). ONNX's runner, onnx.backend.test.BackendTest, then
runs the node cases ("node" kind only) through loom.onnx.backend.Backend.

A case is skipped when its model uses an ONNX op outside loom.onnx.supported_ops(), by op
name, or a data type loom has no dtype for, by type name (uint16/32/64, int16, strings,
complex, sequences, optionals, maps, sparse tensors; and bfloat16, whose values ONNX's cases hand over as uint16 NumPy arrays, NumPy
having no bfloat16): the skip reason lists them. Each case counts under the op it tests (the single
node's op type; an "_expanded" case, the op's function body, under the op it expands).
Prints a table of pass / fail / skip per op and the totals, writes the same as JSON, and
exits 1 when any case fails whose ops loom claims (every case that is not skipped), 0
otherwise. With --expected-failures LEDGER the cases the ledger names (by case name) do not
fail the run; a listed case that ran and did not fail does, so the ledger only shrinks.
"""
import argparse
import collections
import json
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

EXPANDED = "_expanded"


def numpy_aliases():
    """Puts back the NumPy aliases (np.float, np.object, ...) that NumPy 1.24 removed.

    Debian's python3-onnx 1.12 still uses them, in its case generators and in its runner's
    output comparison (np.object), while Debian's NumPy is 1.24: without them no case is
    generated and every comparison raises AttributeError."""
    import numpy as np

    for name, value in (("float", float), ("int", int), ("bool", bool), ("object", object),
                        ("complex", complex), ("str", str)):
        if name not in np.__dict__:
            setattr(np, name, value)


def generate(data_dir):
    """Writes ONNX's generated test cases under data_dir (node/, simple/, real/ kinds)."""
    import onnx
    from onnx.backend.test import cmd_tools

    os.makedirs(data_dir, exist_ok=True)
    cmd_tools.generate_data(argparse.Namespace(output=data_dir, op_type=None))
    with open(os.path.join(data_dir, "onnx_version"), "w") as f:
        f.write(onnx.__version__)


def ensure_data(data_dir, regenerate):
    """Generates the cases unless data_dir has them for this version of ONNX."""
    import onnx

    stamp = os.path.join(data_dir, "onnx_version")
    current = os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__
    if regenerate or not current or not os.path.isdir(os.path.join(data_dir, "node")):
        t0 = time.perf_counter()
        print(f"conformance: generating ONNX {onnx.__version__}'s test cases into {data_dir}",
              file=sys.stderr)
        generate(data_dir)
        print(f"conformance: generated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


# ONNX data types loom has no dtype for, and bfloat16 (see the module's docstring).
UNSUPPORTED_TYPES = {"UINT16", "UINT32", "UINT64", "INT16", "STRING", "COMPLEX64", "COMPLEX128",
                     "BFLOAT16", "SEQUENCE", "OPTIONAL", "MAP", "SPARSE_TENSOR"}


def model_types(model):
    """The ONNX data type names a model's graph inputs, outputs, initializers and Cast targets
    use."""
    import onnx

    names = set()

    def add(t):
        if t:
            names.add(onnx.TensorProto.DataType.Name(t))

    g = model.graph
    for v in list(g.input) + list(g.output):
        kind = v.type.WhichOneof("value")
        if kind == "tensor_type":
            add(v.type.tensor_type.elem_type)
        elif kind is not None:  # sequence_type, optional_type, map_type, sparse_tensor_type
            names.add(kind.replace("_type", "").upper())
    for t in g.initializer:
        add(t.data_type)
    for node in g.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to":
                add(a.i)
            elif a.type == onnx.AttributeProto.TENSOR:
                add(a.t.data_type)
    return names


def case_ops(node_dir):
    """{case name: (op it tests, [ops its model uses, as the backend names them], the data
    types loom lacks that it uses)}."""
    import onnx

    from loom.onnx.backend import graph_op_types

    tested, used, types = {}, {}, {}
    for name in sorted(os.listdir(node_dir)):
        path = os.path.join(node_dir, name, "model.onnx")
        if not os.path.exists(path):
            continue
        model = onnx.load(path)
        used[name] = sorted(graph_op_types(model.graph))
        types[name] = sorted(model_types(model) & UNSUPPORTED_TYPES)
        if len(model.graph.node) == 1:
            node = model.graph.node[0]
            domain = node.domain if node.domain not in ("", "ai.onnx") else ""
            tested[name] = f"{domain}:{node.op_type}" if domain else node.op_type
    result = {}
    for name, ops in used.items():
        # An expanded case may be one node too (CastLike's body is a Cast): the original's op.
        op = tested.get(name[: -len(EXPANDED)]) if name.endswith(EXPANDED) else None
        if op is None:
            op = tested.get(name)
        if op is None:
            # A multi-node case with no single-node original: count it under its ops.
            op = "+".join(sorted({o for _, o in ops}))
        result[name] = (op, ops, types[name])
    return result


def unsupported_reason(ops, supported):
    """'unsupported ONNX ops: A, B' for the ops loom does not claim, or None."""
    missing = sorted({(f"{d}:{o}" if d else o) for d, o in ops
                      if d != "" or o not in supported})
    return f"unsupported ONNX op{'s' if len(missing) > 1 else ''}: {', '.join(missing)}" \
        if missing else None


class _Result(unittest.TestResult):
    """Records each test's outcome: pass, fail (failures and errors) or skip, with a message."""

    def __init__(self, verbose):
        super().__init__()
        self.outcomes = {}
        self.verbose = verbose

    def _record(self, test, outcome, message=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = (outcome, message)
        if self.verbose:
            print(f"{outcome:5} {name} {message}", file=sys.stderr)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", _first_lines(err[1]))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "fail", _first_lines(err[1]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "fail", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "pass")


def _first_lines(exc, limit=400):
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:6])[:limit]


def build_runner(backend, data_dir, cases, supported, device, ops_filter):
    """ONNX's BackendTest over data_dir's node cases, unsupported ops skipped by name."""
    import onnx.backend.test.runner as runner_module
    from onnx.backend.test import BackendTest
    from onnx.backend.test.loader import load_model_tests

    # ONNX's runner loads every kind of case from its package's data directory, which Debian
    # does not ship: hand it the node cases generated into data_dir, and no other kind.
    def node_cases(data_dir_=None, kind=None):
        return load_model_tests(data_dir, kind) if kind == "node" else []

    saved = runner_module.load_model_tests
    runner_module.load_model_tests = node_cases
    try:
        runner = BackendTest(backend, __name__)
    finally:
        runner_module.load_model_tests = saved

    suffix = f"_{device.split(':')[0].lower()}"
    items = runner._test_items["NodeModel"]
    for test_name in list(items):
        case = test_name[: -len(suffix)] if test_name.endswith(suffix) else None
        if case is None or case not in cases or (ops_filter and cases[case][0] not in ops_filter):
            del items[test_name]
            continue
        reason = unsupported_reason(cases[case][1], supported)
        if reason is None and cases[case][2]:
            lacking = cases[case][2]
            reason = f"ONNX data type{'s' if len(lacking) > 1 else ''} loom has no dtype for: {', '.join(lacking)}"
        if reason is not None:
            items[test_name].func = unittest.skip(reason)(items[test_name].func)
    for category in list(runner._test_items):
        if category != "NodeModel":
            del runner._test_items[category]
    return runner


def summarize(outcomes, cases, device):
    """{op: {pass, fail, skip, cases: {case: [outcome, message]}}} and the totals."""
    suffix = f"_{device.split(':')[0].lower()}"
    per_op = collections.defaultdict(lambda: {"pass": 0, "fail": 0, "skip": 0, "cases": {}})
    for test_name, (outcome, message) in sorted(outcomes.items()):
        case = test_name[: -len(suffix)]
        op = cases[case][0]
        per_op[op][outcome] += 1
        per_op[op]["cases"][case] = [outcome, message] if message else [outcome]
    totals = {k: sum(v[k] for v in per_op.values()) for k in ("pass", "fail", "skip")}
    return dict(sorted(per_op.items())), totals


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.path.join(ROOT, "build", "onnx-backend-data"))
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--op", action="append", default=[],
                   help="run only the cases of this ONNX op type (repeatable)")
    p.add_argument("--device", default="CPU")
    p.add_argument("--json", dest="json_out",
                   default=os.path.join(ROOT, "build", "onnx-conformance.json"))
    p.add_argument("--expected-failures", metavar="FILE",
                   help="a JSON ledger of cases known to fail ({case: {op, error}}): they do "
                        "not fail the run, but a listed case that does not fail does")
    p.add_argument("--write-expected-failures", metavar="FILE",
                   help="write this run's failing cases as such a ledger")
    p.add_argument("--verbose", "-v", action="store_true")
    a = p.parse_args()

    numpy_aliases()
    import onnx

    import loom.onnx
    from loom.onnx.backend import Backend

    if not Backend.supports_device(a.device):
        print(f"conformance: loom has no device {a.device}", file=sys.stderr)
        return 2
    ensure_data(a.data_dir, a.regenerate)
    node_dir = os.path.join(a.data_dir, "node")
    supported = set(loom.onnx.supported_ops())
    cases = case_ops(node_dir)
    runner = build_runner(Backend, a.data_dir, cases, supported, a.device, set(a.op))
    result = _Result(a.verbose)
    t0 = time.perf_counter()
    runner.test_suite.run(result)
    seconds = time.perf_counter() - t0
    per_op, totals = summarize(result.outcomes, cases, a.device)

    width = max([len(op) for op in per_op] + [8])
    print(f"{'ONNX op':<{width}} {'pass':>5} {'fail':>5} {'skip':>5}  skipped for lack of")
    for op, counts in per_op.items():
        missing = sorted({m for c in counts["cases"].values() if c[0] == "skip"
                          for m in c[1].split(": ", 1)[-1].split(", ")})
        print(f"{op:<{width}} {counts['pass']:>5} {counts['fail']:>5} {counts['skip']:>5}  "
              f"{', '.join(missing)}")
    failed = [(op, case, c[1] if len(c) > 1 else "") for op, counts in per_op.items()
              for case, c in counts["cases"].items() if c[0] == "fail"]
    if failed:
        print("\nfailed cases:")
        for op, case, message in failed:
            print(f"  {op}: {case}: {message}")
    failing = {case: {"op": op, "error": message} for op, case, message in failed}
    unexpected, stale = sorted(failing), []
    if a.expected_failures:
        with open(a.expected_failures) as f:
            known = json.load(f)
        ran = {case for counts in per_op.values() for case in counts["cases"]}
        unexpected = sorted(set(failing) - set(known))
        stale = sorted(c for c in known if c in ran and c not in failing)
        print(f"\n{len(failing) - len(unexpected)} failures are in {a.expected_failures}; "
              f"{len(unexpected)} are not: {', '.join(unexpected) or 'none'}")
        if stale:
            print(f"listed there but not failing (take them out): {', '.join(stale)}")
    if a.write_expected_failures:
        with open(a.write_expected_failures, "w") as f:
            json.dump(failing, f, indent=1, sort_keys=True)
            f.write("\n")
    claimed = sorted(op for op in supported)
    tested_ops = {op for op in per_op}
    print(f"\nloom claims {len(claimed)} ONNX ops; {len([o for o in claimed if o in tested_ops])} "
          f"of them have node cases here; ops fully passing: "
          f"{sum(1 for c in per_op.values() if c['pass'] and not c['fail'])}")
    if a.expected_failures:
        # Known failures are counted apart, as xfails are.
        print(f"{len(failing) - len(unexpected)} known failures (listed in the ledger)")
        print(f"{totals['pass']} passed, {len(unexpected)} failed, {totals['skip']} skipped")
    else:
        print(f"{totals['pass']} passed, {totals['fail']} failed, {totals['skip']} skipped")

    report = {"onnx_version": onnx.__version__, "device": a.device, "seconds": round(seconds, 1),
              "supported_ops": claimed, "totals": totals, "ops": per_op}
    if a.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if unexpected or stale else 0


if __name__ == "__main__":
    sys.exit(main())
