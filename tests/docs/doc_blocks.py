#!/usr/bin/env python3
"""Every code block of README.md and docs/*.md, checked (make test runs this).

    tests/docs/doc_blocks.py --loom build/loom --prefix build/install [FILES...]

By the block's language:
  python   run, in order, in one namespace per file (a later block may use an earlier one's
           names), from a scratch folder; the block's asserts are its checks
  c, cpp   a block with main() is compiled against the installed loom (--prefix, through
           pkg-config) and run; it must exit 0. A block without main() lists declarations:
           each function, struct and class it names must be declared in include/loom (or
           the C header), so the reference cannot name something loom does not have
  sh       each `make X` must be a target (make -n X); each `loom SUB ...` line must name a
           subcommand whose --help lists every --option the line uses; other commands are
           the install steps make test itself runs (cmake --install, pip, venv)
  text     output and diagrams: not code
A block right after the line "<!-- doc-blocks: needs a GPU -->" runs only where loom sees a
GPU (scripts/gpu-check.sh runs this too); elsewhere it is counted as skipped.
A block in any other language, or with none, fails: say what it is.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


GPU_MARK = "<!-- doc-blocks: needs a GPU -->"


def blocks(path):
    """(language, first line number, text, needs a GPU) of each fenced block."""
    out, lang, start, body, gpu, previous = [], None, 0, [], False, ""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body, gpu = line[3:].strip(), number + 1, [], previous == GPU_MARK
            else:
                out.append((lang, start, "\n".join(body) + "\n", gpu))
                lang = None
        elif lang is not None:
            body.append(line)
        if line.strip():
            previous = line.strip()
    return out


def have_gpu():
    try:
        import loom.cuda
        return loom.cuda.device_count() > 0
    except Exception:  # no loom.cuda, no CUDA build
        return False


class Checker:
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.counts = {}
        self.headers = "\n".join(p.read_text() for p in (ROOT / "include").rglob("*.h*"))
        self.gpu = have_gpu()

    def fail(self, where, why):
        self.failures.append(f"{where}: {why}")

    def count(self, lang):
        self.counts[lang] = self.counts.get(lang, 0) + 1

    # ---- python ---------------------------------------------------------------------------
    def python_blocks(self, path, items):
        namespace = {"__name__": "__doc__"}
        with tempfile.TemporaryDirectory() as scratch:
            here = os.getcwd()
            os.chdir(scratch)
            try:
                for start, text in items:
                    self.count("python")
                    try:
                        exec(compile(text, f"{path}:{start}", "exec"), namespace)
                    except Exception:
                        self.fail(f"{path}:{start}", "python block failed:\n" + traceback.format_exc())
            finally:
                os.chdir(here)

    # ---- c, cpp -----------------------------------------------------------------------------
    def compiled(self, where, lang, text):
        with tempfile.TemporaryDirectory() as scratch:
            src = Path(scratch) / ("block.c" if lang == "c" else "block.cpp")
            src.write_text(text)
            exe = Path(scratch) / "block"
            flags = subprocess.run(
                ["pkg-config", "--cflags", "--libs", "loom"], capture_output=True, text=True,
                env={**os.environ, "PKG_CONFIG_PATH": f"{self.args.prefix}/lib/pkgconfig"})
            if flags.returncode != 0:
                return self.fail(where, f"pkg-config: {flags.stderr.strip()}")
            if lang == "c":
                # C blocks use loom's C ABI (loom/c_api.h): compiled as C, linked as C++.
                obj = Path(scratch) / "block.o"
                cc = subprocess.run(["cc", "-std=c11", "-c", str(src), "-o", str(obj)]
                                    + [f for f in flags.stdout.split() if f.startswith("-I")],
                                    capture_output=True, text=True)
                if cc.returncode != 0:
                    return self.fail(where, "does not compile as C:\n" + cc.stderr)
                link = ["c++", str(obj), "-o", str(exe)] + flags.stdout.split()
            else:
                link = ["c++", "-std=c++20", "-O1", str(src), "-o", str(exe)] + flags.stdout.split()
            built = subprocess.run(link, capture_output=True, text=True)
            if built.returncode != 0:
                return self.fail(where, "does not build:\n" + built.stderr[-3000:])
            ran = subprocess.run([str(exe)], capture_output=True, text=True, cwd=scratch,
                                 timeout=300)
            if ran.returncode != 0:
                self.fail(where, f"exited {ran.returncode}:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}")

    def declarations(self, where, text):
        code = re.sub(r"//.*|/\*.*?\*/", "", text, flags=re.S)
        names = set(re.findall(r"\b(?:struct|class)\s+(\w+)", code))
        names |= set(re.findall(r"\b(\w+)\s*\(", code))
        names -= {"if", "for", "while", "switch", "return", "sizeof", "operator", "const"}
        missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", self.headers))
        if missing:
            self.fail(where, "names nothing in include/loom: " + ", ".join(missing))

    def native(self, path, start, lang, text):
        self.count(lang)
        where = f"{path}:{start}"
        if re.search(r"\bint\s+main\s*\(", text):
            self.compiled(where, lang, text)
        else:
            self.declarations(where, text)

    # ---- sh -------------------------------------------------------------------------------------
    def shell(self, path, start, text):
        self.count("sh")
        where = f"{path}:{start}"
        joined = re.sub(r"\\\n", " ", text)
        lines = [l.split("#", 1)[0].strip() for l in joined.splitlines()]
        loom_line = None
        for line in lines:
            if not line:
                continue
            if line.startswith("[") and loom_line:  # the options of the line above, continued
                line = loom_line + " " + line
            words = line.split()
            if words[0] == "mpirun":  # mpirun -np N [--oversubscribe] COMMAND: check COMMAND
                rest = words[1:]
                while rest and rest[0].startswith("-"):
                    rest = rest[2:] if rest[0] in ("-np", "-n") else rest[1:]
                if not rest:
                    self.fail(where, f"mpirun without a command: {line}")
                    continue
                words = rest
                line = " ".join(rest)
            if words[0] == "make":
                for target in words[1:]:
                    if "=" in target:
                        continue
                    dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True,
                                         text=True)
                    if dry.returncode != 0:
                        self.fail(where, f"make has no target '{target}'")
            elif words[0] in ("loom", "build/loom", "./build/loom"):
                loom_line = line
                self.loom_line(where, words[1:])
            elif words[0] in ("cmake", "pip", "python3") or words[0].endswith(("/pip", "/python")) \
                    or line.startswith("PYTHONPATH="):
                continue  # install steps: make test runs them (scripts/test.sh)
            else:
                self.fail(where, f"a command this check does not know: {line}")

    def loom_line(self, where, words):
        sub = []
        for w in words:
            if w.startswith("-") or w.startswith("[") or not re.fullmatch(r"[a-z]+", w):
                break
            sub.append(w)
        shown = subprocess.run([self.args.loom, *sub, "--help"], capture_output=True, text=True)
        usage = re.search(r"Usage: \S+((?: [a-z]+)*)", shown.stdout)
        if shown.returncode != 0 or usage is None or usage.group(1).split() != sub:
            if sub and sub[-1] == "cuda":  # `loom bench cuda` exists in CUDA builds only
                return self.count("sh line skipped (a CUDA build's)")
            return self.fail(where, f"`loom {' '.join(sub)}` is not a command")
        for option in re.findall(r"(--[a-z][a-z0-9-]*)", " ".join(words)):
            if option not in shown.stdout:
                self.fail(where, f"`loom {' '.join(sub)}` has no option {option}")

    # ---- a file -----------------------------------------------------------------------------------
    def check(self, path):
        rel = path.relative_to(ROOT)
        python = []
        for lang, start, text, gpu in blocks(path):
            if gpu and not self.gpu:
                self.count(f"{lang} skipped (needs a GPU)")
                continue
            if lang == "python":
                python.append((start, text))
            elif lang in ("c", "cpp"):
                self.native(rel, start, lang, text)
            elif lang == "sh":
                self.shell(rel, start, text)
            elif lang == "text":
                self.count("text")
            else:
                self.fail(f"{rel}:{start}", f"a block of language '{lang or 'none'}': name it "
                                            "(python, c, cpp, sh, or text for output)")
        if python:
            self.python_blocks(rel, python)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loom", default=str(ROOT / "build" / "loom"))
    parser.add_argument("--prefix", default=str(ROOT / "build" / "install"))
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    files = [Path(f).resolve() for f in args.files] or \
        [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checker = Checker(args)
    for f in files:
        checker.check(f)
    summary = ", ".join(f"{n} {lang}" for lang, n in sorted(checker.counts.items()))
    for failure in checker.failures:
        print("FAIL", failure, file=sys.stderr)
    print(f"doc blocks: {summary}; {len(checker.failures)} failed")
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
