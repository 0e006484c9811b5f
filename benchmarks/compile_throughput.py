"""Compile throughput against bare YAML parsing of the same files, side by side.

    PYTHONPATH=. python benchmarks/compile_throughput.py [FLOWS] [STEPS] [REPEAT] [--before DIR]

What it measures: that `flowlane compile` costs at most twice what parsing the same YAML
costs.

Generates FLOWS flow files of STEPS steps each (a layered DAG with maps, conditions
and options), then times, best of REPEAT runs:

- bare: read every file and ``yaml.load`` it with PyYAML's C loader;
- bare, GC paused: the same with the cyclic garbage collector paused (the
  compiler pauses it while loading; shown so the comparison stays honest);
- compile: ``flowlane.compiler`` load + schema + semantic checks + SQL rendering
  (everything ``flowlane compile`` does except writing files).

Each compile is timed in a child process of the checkout it measures (this one, and the
one given with ``--before DIR``, e.g. ``git archive REV | tar -x -C DIR``), on the same files
in the same run, in REPEAT rounds that each time the bare parses and every checkout (best
of two runs of each per round), so the ratios compare even on a loaded machine.

Defaults: 1000 flows of 20 steps, best of 3. How to read it: each compile line's "x bare
parse" is its time over the bare parse's in the same run; the target is at most 2x. With
--before, compare the two compile lines' ratios, not their seconds.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent.parent
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def flow_yaml(index: int, steps: int) -> str:
    lines = [
        "kind: flow",
        f"slug: bench_flow_{index}",
        f"description: generated flow {index}",
        "defaults:",
        "  max_attempts: 3",
        "  base_delay: 5",
        "  timeout: 60",
        "steps:",
    ]
    for step in range(steps):
        needs: list[int] = []
        lines.append(f"  step_{step}:")
        lines.append(f"    handler: bench.handlers.module_{step % 5}:handle_{step}")
        if step:
            needs = sorted({step - 1, step // 2} - {step})
            if step % 4 == 1:
                needs = needs[:1]
                lines.append("    type: map")
            lines.append("    needs: [" + ", ".join(f"step_{n}" for n in needs) + "]")
        if step % 7 == 3:  # a condition tests a need's output
            lines.append(f"    if: {{step_{needs[0]}: {{ok: true, label: \"it's {step}\"}}}}")
            lines.append("    when_unmet: skip-cascade")
        if step % 3 == 0:
            lines.append(f"    timeout: {30 + step}")
    return "\n".join(lines) + "\n"


def generate(root: Path, flows: int, steps: int) -> list[Path]:
    files = []
    for index in range(flows):
        path = root / f"flow_{index:04d}.yaml"
        path.write_text(flow_yaml(index, steps), encoding="utf-8")
        files.append(path)
    return files


def bare(files: list[Path]) -> int:
    loaded = 0
    for file in files:
        loaded += len(yaml.load(file.read_text(encoding="utf-8"), Loader=LOADER)["steps"])
    return loaded


def bare_gc_paused(files: list[Path]) -> int:
    """The same bare parse with the cyclic GC paused, as the compiler pauses it."""
    gc.disable()
    try:
        return bare(files)
    finally:
        gc.enable()


# run in a child with the measured checkout first on sys.path: best of REPEAT, in seconds
CHILD = """
import sys, time
from flowlane import compiler
root, repeat = sys.argv[1], int(sys.argv[2])
timings = []
for _ in range(repeat):
    started = time.perf_counter()
    compiler.compile_project(compiler.load_project([root]))
    timings.append(time.perf_counter() - started)
print(min(timings))
"""


def compile_in(checkout: Path, root: Path, repeat: int) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(repeat)],
                          env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False, cwd=root)
    if done.returncode:
        raise SystemExit(f"compile in {checkout} failed:\n{done.stderr}")
    return float(done.stdout.split()[-1])


def best_of(repeat: int, fn: Callable[[], int]) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - started)
    return min(timings)


def split_before(argv: list[str]) -> tuple[Path | None, list[str]]:
    """``--before DIR`` (the checkout to compare with) and the other arguments."""
    if "--before" not in argv:
        return None, argv
    at = argv.index("--before")
    return Path(argv[at + 1]).resolve(), argv[:at] + argv[at + 2:]


def main(argv: list[str]) -> None:
    before, argv = split_before(argv)
    flows = int(argv[0]) if argv else 1000
    steps = int(argv[1]) if len(argv) > 1 else 20
    repeat = int(argv[2]) if len(argv) > 2 else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = generate(root, flows, steps)
        size = sum(f.stat().st_size for f in files)
        checkouts = [("before", before)] if before else []
        checkouts.append(("after" if before else "compile", HERE))
        best = {name: float("inf") for name, _ in checkouts}
        bare_s = paused_s = float("inf")
        for _ in range(repeat):  # each round measures all: the machine's load hits every one
            bare_s = min(bare_s, best_of(2, lambda: bare(files)))
            paused_s = min(paused_s, best_of(2, lambda: bare_gc_paused(files)))
            for name, checkout in checkouts:
                best[name] = min(best[name], compile_in(checkout, root, 2))
        compiles = list(best.items())
    print(f"input: {flows} flows x {steps} steps, {size / 1e6:.1f} MB of YAML "
          f"(C loader: {LOADER.__name__}), best of {repeat}")
    print(f"bare yaml.load       : {bare_s:7.3f} s  ({flows / bare_s:8.0f} flows/s)")
    print(f"bare, GC paused      : {paused_s:7.3f} s  ({flows / paused_s:8.0f} flows/s)")
    for name, seconds in compiles:
        print(f"flowlane compile {name:<6}: {seconds:7.3f} s  ({flows / seconds:8.0f} flows/s)"
              f"  {seconds / bare_s:.2f}x bare parse (target <= 2x), "
              f"{seconds / paused_s:.2f}x the GC-paused parse")


if __name__ == "__main__":
    main(sys.argv[1:])
