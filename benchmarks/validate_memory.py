"""Peak memory of `flowlane validate` on one large file, as a multiple of the file's size,
for this checkout and (``--before DIR``) another, side by side in one run.

Generates one YAML file of about SIZE_MB megabytes (flow documents of STEPS steps, separated
by `---`), then runs ``python -m flowlane validate FILE`` in a child process per checkout and
reads the child's peak resident set size (``ru_maxrss``). The interpreter with flowlane's
imports is measured the same way on a one-flow file and subtracted, so the multiple is what
the file itself costs.

Usage: python benchmarks/validate_memory.py [SIZE_MB] [STEPS] [--before DIR]
Target: validate stays within 30x the file's size (the interpreter and imports not counted).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "benchmarks"))

from compile_throughput import flow_yaml, split_before  # noqa: E402  (the same flows)

PEAK = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "flowlane", "validate", sys.argv[1]],
               stdout=subprocess.DEVNULL, check=False)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def peak_bytes(checkout: Path, file: Path) -> int:
    """Peak RSS of one `flowlane validate FILE` run with ``checkout`` on the path."""
    done = subprocess.run([sys.executable, "-c", PEAK, str(file)], cwd=file.parent,
                          env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def generate(path: Path, size_mb: float, steps: int) -> int:
    documents, total, index = [], 0, 0
    while total < size_mb * 1e6:
        text = flow_yaml(index, steps)
        documents.append(text)
        total += len(text) + 4
        index += 1
    path.write_text("---\n".join(documents), encoding="utf-8")
    return index


def main(argv: list[str]) -> None:
    before, argv = split_before(argv)
    size_mb = float(argv[0]) if argv else 10.0
    steps = int(argv[1]) if len(argv) > 1 else 20
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "flows.yaml", Path(tmp) / "one.yaml"
        flows = generate(big, size_mb, steps)
        small.write_text(flow_yaml(0, steps), encoding="utf-8")
        size = big.stat().st_size
        print(f"input: one file of {size / 1e6:.1f} MB, {flows} flow documents x {steps} steps")
        checkouts = [("before", before)] if before else []
        checkouts.append(("after" if before else "validate", HERE))
        for name, checkout in checkouts:
            base = peak_bytes(checkout, small)
            peak = peak_bytes(checkout, big)
            print(f"{name:<8}: peak {peak / 2**20:7.1f} MiB (interpreter and imports "
                  f"{base / 2**20:5.1f} MiB): {(peak - base) / size:5.1f}x the file's size "
                  f"(target <= 30x)")


if __name__ == "__main__":
    main(sys.argv[1:])
