#!/usr/bin/env python3
"""Writes a synthetic allocation log of an MLP training run (data/mlp_training.alloc.csv).

The log has the format logging_adaptor writes (see include/loom/memory/logging_adaptor.hpp)
and is what `loom memreplay` replays. It models, in float32, an MLP 784-512-512-10 with
dropout, trained with Adam on batches of 128, in eager style (every op allocates its output
and frees its inputs as soon as their last use is done):

- thread 0, the training loop: parameters initialised once ("mlp/init"); each step runs the
  forward pass ("mlp/forward", GEMM workspaces, activations and dropout masks kept for
  backward), the backward pass ("mlp/backward", gradients kept until the optimizer runs)
  and the optimizer ("adam/step": the moments m and v allocated once at the first step, an
  update temporary per parameter, the gradients freed); every few steps, an evaluation on a
  batch of 2048 ("mlp/eval").
- thread 1, the data loader ("data/loader"): prepares the next batch while a step runs; the
  training loop frees each batch when backward is done with it.

Times come from a rough cost model (FLOPs at a fixed rate plus a per-op overhead, with
jitter); pointers come from a simulated caching allocator (blocks rounded to 512 bytes,
freed blocks reused by size, LIFO), so they look like a real run's. All on the default
stream. The output is a pure function of the options: the same seed writes the same bytes.

Usage: scripts/make_alloc_log.py [--seed N] [--steps N] [--eval-every N] [-o PATH]
"""

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

F32 = 4
BATCH = 128
EVAL_BATCH = 2048
LAYERS = [(784, 512), (512, 512), (512, 10)]
FLOPS_PER_NS = 100.0  # 100 GFLOP/s
OP_OVERHEAD_NS = 4_000
HEADER = "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome"


@dataclass
class Event:
    time_ns: int
    order: int  # creation order: breaks ties between equal times
    thread: int
    action: str
    block: int
    nbytes: int
    alignment: int
    tag: str


class Trace:
    """Events of both threads; each thread keeps its own clock."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.events: list[Event] = []
        self.sizes: dict[int, tuple[int, int]] = {}  # live block -> (bytes, alignment)
        self.next_block = 0
        self.clock = [0, 0]  # per thread
        self.tag = "mlp/init"

    def advance(self, thread: int, flops: float = 0.0) -> None:
        cost = OP_OVERHEAD_NS + flops / FLOPS_PER_NS
        self.clock[thread] += int(cost * self.rng.uniform(0.9, 1.1))

    def alloc(self, nbytes: int, alignment: int = 64, thread: int = 0,
              tag: str | None = None) -> int:
        block = self.next_block
        self.next_block += 1
        self.sizes[block] = (nbytes, alignment)
        self.clock[thread] += self.rng.randint(200, 900)
        self.events.append(Event(self.clock[thread], len(self.events), thread, "allocate",
                                 block, nbytes, alignment, self.tag if tag is None else tag))
        return block

    def free(self, *blocks: int, thread: int = 0) -> None:
        for block in blocks:
            nbytes, alignment = self.sizes.pop(block)
            self.clock[thread] += self.rng.randint(100, 400)
            self.events.append(Event(self.clock[thread], len(self.events), thread, "deallocate",
                                     block, nbytes, alignment, self.tag))

    def gemm(self, m: int, k: int, n: int) -> int:
        """Allocates the m x n output of an m x k by k x n product, with its workspace."""
        workspace = self.alloc(self.rng.choice([64, 128, 256, 512]) << 10, alignment=256)
        out = self.alloc(m * n * F32)
        self.advance(0, 2.0 * m * k * n)
        self.free(workspace)
        return out

    def elementwise(self, nbytes: int, elements: int) -> int:
        out = self.alloc(nbytes)
        self.advance(0, elements)
        return out


def load_batch(t: Trace, batch: int, at_ns: int) -> tuple[int, int]:
    """The data loader's images and labels, ready at `at_ns` on thread 1."""
    t.clock[1] = max(t.clock[1], at_ns)
    images = t.alloc(batch * 784 * F32, thread=1, tag="data/loader")
    t.advance(1, batch * 784 * 8)
    labels = t.alloc(batch * 8, thread=1, tag="data/loader")
    return images, labels


def forward(t: Trace, x: int, batch: int, train: bool) -> tuple[int, list[tuple[int, int, int]]]:
    """Returns the logits and, when training, per hidden layer the blocks backward needs:
    (relu output, dropout mask, dropout output)."""
    saved = []
    h = x
    for i, (fan_in, fan_out) in enumerate(LAYERS):
        z = t.gemm(batch, fan_in, fan_out)
        if not train and h != x:
            t.free(h)  # evaluation keeps nothing for a backward pass
        if i + 1 == len(LAYERS):
            return z, saved
        a = t.elementwise(batch * fan_out * F32, batch * fan_out)  # relu
        t.free(z)
        if train:
            mask = t.elementwise(batch * fan_out, batch * fan_out)  # one byte per element
            h = t.elementwise(batch * fan_out * F32, batch * fan_out)
            saved.append((a, mask, h))
        else:
            h = a
    raise AssertionError("LAYERS is empty")


def train_step(t: Trace, shapes: list[int], moments: list[tuple[int, int]],
               batch: tuple[int, int]) -> None:
    x, y = batch
    t.tag = "mlp/forward"
    logits, saved = forward(t, x, BATCH, train=True)
    probs = t.elementwise(BATCH * 10 * F32, BATCH * 10 * 4)  # softmax
    lse = t.alloc(BATCH * F32)
    loss = t.alloc(F32)
    t.free(lse, logits)

    t.tag = "mlp/backward"
    grads = []
    delta = t.elementwise(BATCH * 10 * F32, BATCH * 10)  # dlogits
    t.free(probs)
    for i in reversed(range(len(LAYERS))):
        fan_in, fan_out = LAYERS[i]
        dw = t.gemm(fan_in, BATCH, fan_out)
        scratch = t.alloc(fan_out * F32 * 4)  # column-sum partials
        db = t.alloc(fan_out * F32)
        t.advance(0, BATCH * fan_out)
        t.free(scratch)
        grads = [dw, db] + grads
        if i == 0:
            t.free(delta)
            break
        a, mask, dropped = saved[i - 1]
        d_dropped = t.gemm(BATCH, fan_out, fan_in)
        t.free(delta, dropped)
        d_a = t.elementwise(BATCH * fan_in * F32, BATCH * fan_in)  # through dropout
        t.free(d_dropped, mask)
        delta = t.elementwise(BATCH * fan_in * F32, BATCH * fan_in)  # through relu
        t.free(d_a, a)
    t.free(loss, x, y)

    t.tag = "adam/step"
    norms = t.alloc(len(shapes) * F32)  # gradient norms for clipping
    t.advance(0, sum(shapes) / F32)
    t.free(norms)
    if not moments:
        for nbytes in shapes:
            moments.append((t.alloc(nbytes), t.alloc(nbytes)))
    for g, nbytes in zip(grads, shapes):
        update = t.alloc(nbytes)
        t.advance(0, 10 * nbytes / F32)
        t.free(update, g)


def evaluate(t: Trace) -> None:
    t.tag = "mlp/eval"
    images, labels = load_batch(t, EVAL_BATCH, t.clock[0])
    t.clock[0] = max(t.clock[0], t.clock[1])
    logits, _ = forward(t, images, EVAL_BATCH, train=False)
    predicted = t.alloc(EVAL_BATCH * 8)
    correct = t.alloc(F32)
    t.advance(0, EVAL_BATCH * 10)
    t.free(predicted, correct, logits, images, labels)


def generate(seed: int, steps: int, eval_every: int) -> list[Event]:
    t = Trace(random.Random(seed))
    shapes = []  # bytes of each parameter (kept for the whole run)
    for fan_in, fan_out in LAYERS:
        for nbytes in (fan_in * fan_out * F32, fan_out * F32):
            init = t.alloc(nbytes)  # random normal draws, scaled into the parameter
            t.alloc(nbytes)
            t.advance(0, 20 * nbytes / F32)
            t.free(init)
            shapes.append(nbytes)
    moments: list[tuple[int, int]] = []
    batch = load_batch(t, BATCH, 0)
    for step in range(steps):
        start = t.clock[0]
        next_batch = load_batch(t, BATCH, start + t.rng.randint(20_000, 120_000))
        train_step(t, shapes, moments, batch)
        t.clock[0] = max(t.clock[0], t.clock[1])  # wait for the loader
        batch = next_batch
        if (step + 1) % eval_every == 0:
            evaluate(t)
    t.tag = ""  # the loop has ended: no scope is tagging
    t.free(*batch)
    return sorted(t.events, key=lambda e: (e.time_ns, e.order))


def assign_pointers(events: list[Event]) -> dict[int, int]:
    """A caching allocator's addresses: 512-byte rounding, freed blocks reused by size."""
    base, top = 0x7F3A2C000000, 0
    free: dict[int, list[int]] = {}
    pointers: dict[int, int] = {}
    for e in events:
        rounded = max(512, (e.nbytes + 511) // 512 * 512)
        if e.action == "allocate":
            cached = free.get(rounded)
            if cached:
                pointers[e.block] = cached.pop()
            else:
                pointers[e.block] = base + top
                top += rounded
        else:
            free.setdefault(rounded, []).append(pointers[e.block])
    return pointers


def write_log(events: list[Event], out, provenance: str) -> None:
    pointers = assign_pointers(events)
    out.write("# loom allocation log v1\n")
    out.write(f"# {provenance}\n")
    out.write(HEADER + "\n")
    for seq, e in enumerate(events):
        out.write(f"{seq},{e.thread},{e.time_ns},{e.action},{pointers[e.block]:#x},{e.nbytes},"
                  f"{e.alignment},0x0,{e.tag},ok\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=25)
    repo = Path(__file__).resolve().parent.parent
    parser.add_argument("-o", "--output", type=Path,
                        default=repo / "data" / "mlp_training.alloc.csv")
    args = parser.parse_args()
    events = generate(args.seed, args.steps, args.eval_every)
    provenance = (f"synthetic: scripts/make_alloc_log.py --seed {args.seed} --steps {args.steps} "
                  f"--eval-every {args.eval_every} (MLP 784-512-512-10, batch {BATCH}, Adam)")
    with open(args.output, "w", newline="\n") as out:
        write_log(events, out, provenance)
    print(f"{args.output}: {len(events)} events", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
