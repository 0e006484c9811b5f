"""Compile throughput against bare YAML parsing of the same files, side by side.

Generates FLOWS flow files of STEPS steps each (a layered DAG with maps,
conditions and options), then times, best of REPEAT runs:

- bare: read every file and ``yaml.load`` it with PyYAML's C loader;
- bare, GC paused: the same with the cyclic garbage collector paused (the
  compiler pauses it while loading; shown so the comparison stays honest);
- compile: ``flowlane.compiler`` load + schema + semantic checks + SQL rendering
  (everything ``flowlane compile`` does except writing files).

Usage: python benchmarks/compile_throughput.py [FLOWS] [STEPS] [REPEAT]
Target: compile <= 3x bare parse.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from flowlane import compiler

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
        lines.append(f"  step_{step}:")
        lines.append(f"    handler: bench.handlers.module_{step % 5}:handle_{step}")
        if step:
            needs = sorted({step - 1, step // 2} - {step})
            if step % 4 == 1:
                needs = needs[:1]
                lines.append("    type: map")
            lines.append("    needs: [" + ", ".join(f"step_{n}" for n in needs) + "]")
        if step % 7 == 3:
            lines.append(f"    if: {{step_{step - 1}: {{ok: true, label: \"it's {step}\"}}}}")
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


def compile_all(root: Path) -> int:
    project = compiler.load_project([root])
    return len(compiler.compile_project(project))


def best_of(repeat: int, fn: Callable[[], int]) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - started)
    return min(timings)


def main(argv: list[str]) -> None:
    flows = int(argv[0]) if argv else 1000
    steps = int(argv[1]) if len(argv) > 1 else 20
    repeat = int(argv[2]) if len(argv) > 2 else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = generate(root, flows, steps)
        size = sum(f.stat().st_size for f in files)
        bare_s = best_of(repeat, lambda: bare(files))
        paused_s = best_of(repeat, lambda: bare_gc_paused(files))
        compile_s = best_of(repeat, lambda: compile_all(root))
    print(f"input: {flows} flows x {steps} steps, {size / 1e6:.1f} MB of YAML "
          f"(C loader: {LOADER.__name__}), best of {repeat}")
    print(f"bare yaml.load : {bare_s:7.3f} s  ({flows / bare_s:8.0f} flows/s)")
    print(f"bare, GC paused: {paused_s:7.3f} s  ({flows / paused_s:8.0f} flows/s)")
    print(f"flowlane compile: {compile_s:7.3f} s  ({flows / compile_s:8.0f} flows/s)")
    print(f"ratio compile / bare parse: {compile_s / bare_s:.2f}x (target <= 3x); "
          f"against the GC-paused parse: {compile_s / paused_s:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
