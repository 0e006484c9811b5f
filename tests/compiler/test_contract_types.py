"""``flowlane types`` turns contracts into TypedDicts: the examples' handlers are typed with
them, mypy --strict accepts the examples and refuses a handler that breaks a contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flowlane.compiler import api, pytypes

ROOT = Path(__file__).resolve().parents[2]

BROKEN = '''
from typing import Any

from examples.flowtypes import DiamondTotalHandlerInput, DiamondTotalOutput


def total(input: DiamondTotalHandlerInput, ctx: Any = None) -> DiamondTotalOutput:
    missing = input["describe"]["size"]
    return {"total": str(missing), "count": 1, "notify": False}
'''


def test_the_committed_example_types_are_what_flowlane_types_writes() -> None:
    text = pytypes.render(api.load_project([ROOT / "flows"]))
    assert (ROOT / "examples" / "flowtypes.py").read_text(encoding="utf-8") == text, (
        "regenerate with `flowlane types flows --out examples/flowtypes.py`")


def test_mypy_strict_accepts_the_examples_and_refuses_a_handler_breaking_a_contract(
        tmp_path: Path) -> None:
    broken = tmp_path / "broken_handlers.py"
    broken.write_text(BROKEN, encoding="utf-8")
    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "examples", str(broken)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in found.stdout.splitlines() if ": error:" in line]
    assert all(line.startswith(str(broken)) for line in errors), found.stdout
    assert any('"DiamondDescribeOutput" has no key "size"' in line for line in errors), found.stdout
    assert any('"total"' in line and "int" in line for line in errors), found.stdout
    assert len(errors) == 2, found.stdout


def test_a_project_without_contracts_gets_the_names_module_it_always_got() -> None:
    project = api.project_from_text("kind: flow\nslug: plain\nsteps:\n  a:\n    handler: m.h:a\n")
    text = pytypes.render(project)
    assert "from typing import Literal, Never\n" in text and "TypedDict" not in text
