"""What a worker refuses before it polls: bad selection, missing handlers, shape mismatches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.runtime.rt_support import flowlane

pytestmark = pytest.mark.slow


def _project(tmp_path: Path, yaml: str, handlers: str = "") -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "app.yaml").write_text(yaml)
    (tmp_path / "app_handlers.py").write_text(handlers)
    return tmp_path


def test_missing_handlers_refuse_to_start_naming_the_yaml_line(dsn: str, tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "kind: flow\nslug: broken\nsteps:\n  a:\n    handler: app_handlers:a\n"
        "  b:\n    needs: [a]\n    handler: app_handlers:nope\n"
        "  c:\n    needs: [a]\n    handler: missing_module:c\n",
        "def a(input, ctx):\n    return 1\n",
    )
    result = flowlane("worker", "--flow", "broken", "--dsn", dsn, cwd=root)
    assert result.returncode == 1
    assert "flows/app.yaml:8: handler app_handlers:nope of step broken.b" in result.stderr
    assert (
        "flows/app.yaml:11: handler missing_module:c of step broken.c: "
        "module 'missing_module' not found" in result.stderr
    )
    assert "Traceback" not in result.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.workers").fetchone() == (0,)


def test_selection_errors_are_usage_errors(dsn: str, tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "kind: flow\nslug: split\nqueues: per-step\nsteps:\n  a:\n    handler: app_handlers:a\n",
        "def a(input, ctx):\n    return 1\n",
    )
    result = flowlane("worker", "--flow", "split", "--dsn", dsn, cwd=root)
    assert result.returncode == 2 and "--step is required" in result.stderr
    assert "--flow split --step a" in result.stderr
    unknown = flowlane("worker", "--flow", "nope", "--dsn", dsn, cwd=root)
    assert unknown.returncode == 2 and "unknown flow 'nope'" in unknown.stderr


def test_shape_mismatch_refuses_to_start_listing_differences(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('drift')")
        conn.execute("select flowlane.add_step('drift', 'a')")
        conn.execute("select flowlane.add_step('drift', 'b', array['a'])")
    root = _project(
        tmp_path,
        "kind: flow\nslug: drift\nsteps:\n  a:\n    handler: app_handlers:a\n",
        "def a(input, ctx):\n    return 1\n",
    )
    result = flowlane("worker", "--flow", "drift", "--dsn", dsn, cwd=root)
    assert result.returncode == 1
    assert (
        "flow drift" in result.stderr
        and "step count: 2 in the database, 1 in the given shape" in result.stderr
    )
    assert "new flow slug" in result.stderr


def test_unmigrated_database_gets_a_migrate_hint(db_factory: Any, tmp_path: Path) -> None:
    bare = db_factory("none")  # PGMQ only, no flowlane schema
    root = _project(
        tmp_path,
        "kind: flow\nslug: plain\nsteps:\n  a:\n    handler: app_handlers:a\n",
        "def a(input, ctx):\n    return 1\n",
    )
    worker = flowlane("worker", "--flow", "plain", "--dsn", bare, cwd=root)
    assert worker.returncode == 1 and "hint: " in worker.stderr
    assert "flowlane db migrate" in worker.stderr and "Traceback" not in worker.stderr
    start = flowlane("start", "plain", "--dsn", bare, cwd=root)
    assert start.returncode == 1 and "flowlane db migrate" in start.stderr


def test_unreachable_database_is_one_clear_error(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "kind: flow\nslug: plain\nsteps:\n  a:\n    handler: app_handlers:a\n",
        "def a(input, ctx):\n    return 1\n",
    )
    result = flowlane("worker", "--flow", "plain", "--dsn", "postgresql://nobody@127.0.0.1:1/x", cwd=root)
    assert result.returncode == 1
    assert "error: worker cannot connect to postgresql://nobody@127.0.0.1:1/x" in result.stderr
    assert "Connection refused" in result.stderr and "Traceback" not in result.stderr


def test_unparseable_dsn_is_a_usage_error_that_hides_the_password(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "kind: flow\nslug: plain\nsteps:\n  a:\n    handler: app_handlers:a\n",
        "def a(input, ctx):\n    return 1\n",
    )
    result = flowlane("worker", "--flow", "plain", "--dsn", "host=x password=hunter2 junk", cwd=root)
    assert result.returncode == 2, result.stderr
    assert "error: invalid connection string host=x password=*** junk" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
    assert "hint: use a URL" in result.stderr
