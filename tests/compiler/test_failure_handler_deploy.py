"""A failure handler and a step's compensation through compile, plan and apply on a real
database: adding, moving or removing them is an option change, applied without a new version."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.compiler.test_cli import run_joined

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: orders
steps:
  charge:
    handler: shop.orders:charge
  ship:
    needs: [charge]
    handler: shop.orders:ship
---
kind: flow
slug: undo_order
steps:
  report:
    handler: shop.orders:report
"""



def test_adding_and_removing_a_failure_handler_or_a_compensation_is_an_option_change(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    flows = tmp_path / "flows" / "orders.yaml"
    flows.parent.mkdir()
    flows.write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    flows.write_text(FLOWS.replace("slug: orders\n",
                                   "slug: orders\non_failure: {flow: undo_order, on_cancel: true}\n")
                     .replace("shop.orders:charge\n",
                              "shop.orders:charge\n    compensate: {flow: undo_order}\n"))
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE    flow orders\n"
            "  on_failure: none in the database, undo_order in the YAML\n"
            "  on_failure_on_cancel: false in the database, true in the YAML\n"
            "  step charge: compensate: none in the database, undo_order in the YAML\n") in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select opt_on_failure, opt_on_failure_on_cancel from flowlane.flows "
                            "where flow_slug = 'orders'").fetchone() == ("undo_order", True)
        assert conn.execute("select opt_compensate from flowlane.steps "
                            "where flow_slug = 'orders'").fetchone() == ("undo_order",)
    assert "NO_CHANGE             flow orders" in run_joined(capsys, "plan", "--dsn", dsn)[1]
    flows.write_text(FLOWS)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert ("SAFE_OPTION_CHANGE    flow orders\n"
            "  on_failure: undo_order in the database, none in the YAML\n") in out, out
