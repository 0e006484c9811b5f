"""Compiled SQL on a real PostgreSQL: idempotent apply, plan/apply/verify, immutable shapes,
exact round trips of YAML strings, aliases."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowlane.cli import main
from flowlane.compiler import api, shape, sqltext
from tests.compiler.strategies import TEXT, flow_documents, to_yaml
from tests.compiler.test_properties import _mutations

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DB_EXAMPLES = settings(max_examples=15, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture,
                                              HealthCheck.too_slow])
_counter = itertools.count()


def snapshot(conn: psycopg.Connection[Any]) -> list[Any]:
    """Everything apply may touch, for before/after comparisons."""
    rows: list[Any] = []
    for table, order in (("flows", "flow_slug"), ("steps", "flow_slug, step_index"),
                         ("deps", "flow_slug, step_slug, dep_slug"), ("aliases", "alias"),
                         ("alias_history", "id"), ("queues", "queue_name")):
        rows.append(conn.execute(
            f"select to_jsonb(t) - 'created_at' - 'updated_at' - 'changed_at' "
            f"from flowlane.{table} t order by {order}").fetchall())
    rows.append(conn.execute("select queue_name from pgmq.list_queues() order by 1").fetchall())
    return rows


def run_file(conn: psycopg.Connection[Any], text: str) -> None:
    """Run a compiled file (its own begin/commit); on error roll back and re-raise."""
    try:
        conn.execute(text)
    except psycopg.Error:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.execute("rollback")
        raise


@pytest.fixture
def project_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "flows", tmp_path / "flows")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compiled_examples_apply_twice_second_time_changes_nothing(
    conn: psycopg.Connection[Any],
) -> None:
    files = api.compile_project(api.load_project([ROOT / "flows"]))
    ordered = [*sorted(k for k in files if k.startswith("flows/")), "aliases.sql"]
    for name in ordered:
        run_file(conn, files[name])
    first = snapshot(conn)
    for name in ordered:
        run_file(conn, files[name])
    assert snapshot(conn) == first
    for flow in api.load_project([ROOT / "flows"]).flows:
        stored = conn.execute("select flowlane.get_flow_shape(%s)", (flow.slug,)).fetchone()
        assert stored is not None and stored[0] == shape.flow_shape(flow)
    assert conn.execute("select flowlane.resolve_flow('community_threads')").fetchone() == (
        "community_threads_v2",)
    assert conn.execute("select count(*) from flowlane.alias_history").fetchone() == (1,)


def test_plan_apply_verify_end_to_end(dsn: str, project_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "plan", "--dsn", dsn)
    assert code == 0 and "NEW_FLOW              flow hello_world" in out
    assert "ALIAS_MOVE            alias community_threads" in out
    code, out, _ = cli(capsys, "plan", "--dsn", dsn, "--format", "markdown")
    assert code == 0 and "| `NEW_FLOW` | flow hello_world | 1 step(s) on hello_world |" in out
    assert cli(capsys, "verify", "--dsn", dsn)[0] == 1
    code, out, _ = cli(capsys, "apply", "--dsn", dsn)
    assert code == 0 and "applied 7 file(s) in one transaction" in out
    code, out, _ = cli(capsys, "verify", "--dsn", dsn)
    assert code == 0 and "ok: the database matches the YAML" in out
    assert cli(capsys, "apply", "--dsn", dsn)[0] == 0  # idempotent

    # an option change is safe, and verify reports it as drift until applied
    hello = project_dir / "flows" / "hello_world.yaml"
    hello.write_text(hello.read_text().replace("steps:\n", "defaults: {timeout: 90}\nsteps:\n"))
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "plan", "--dsn", dsn)
    assert code == 0 and "SAFE_OPTION_CHANGE    flow hello_world" in out
    assert "timeout: 60 in the database, 90 in the YAML" in out
    assert cli(capsys, "verify", "--dsn", dsn)[0] == 1
    assert cli(capsys, "apply", "--dsn", dsn)[0] == 0
    assert cli(capsys, "verify", "--dsn", dsn)[0] == 0

    # so is retention; leaving it out again brings back the default
    options = hello.read_text()
    for retention, shown, stored in (("forever", "2592000 in the database, forever", None),
                                     ("7d", "forever in the database, 604800", 604800)):
        hello.write_text(options.replace("steps:\n", f"retention: {retention}\nsteps:\n", 1))
        assert cli(capsys, "compile")[0] == 0
        code, out, _ = cli(capsys, "plan", "--dsn", dsn)
        assert code == 0 and f"retention: {shown} in the YAML" in out, out
        assert cli(capsys, "apply", "--dsn", dsn)[0] == 0
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select opt_retention from flowlane.flows "
                                "where flow_slug = 'hello_world'").fetchone() == (stored,)

    # moving an alias is its own reviewable change, recorded with history
    threads = project_dir / "flows" / "community_threads.yaml"
    threads.write_text(threads.read_text().replace(
        "active: community_threads_v2\ndraining: [community_threads_v1]",
        "active: community_threads_v1\ndraining: [community_threads_v2]"))
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "plan", "--dsn", dsn)
    assert "ALIAS_MOVE            alias community_threads" in out
    assert "community_threads_v2 (draining: community_threads_v1) -> community_threads_v1" in out
    assert cli(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.alias_history").fetchone() == (2,)

    # a shape change of an applied slug is refused and leaves the database unchanged
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = snapshot(conn)
    hello.write_text(hello.read_text() + "  wave:\n    needs: [greet]\n    handler: m:wave\n")
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "plan", "--dsn", dsn)
    assert code == 1 and "NEW_VERSION_REQUIRED  flow hello_world" in out
    # the database's words (a worker's startup check, verify_flow), a step added named by slug
    assert "\n  step `wave` added in the given shape (position 1)\n" in out
    assert "step count" not in out
    assert ("declare the changed flow as a new version, e.g. `hello_world_v2`, and move an "
            "alias to it (callers of a bare `hello_world` keep that name") in out
    code, _, err = cli(capsys, "apply", "--dsn", dsn)
    assert code == 1 and "apply refused" in err
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert snapshot(conn) == before

    # removing a flow from the YAML never deletes it
    hello.unlink()
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "plan", "--dsn", dsn)
    assert code == 0 and "ONLY_IN_DATABASE      flow hello_world" in out


def test_apply_refuses_stale_sql(dsn: str, project_dir: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "compile")[0] == 0
    sql = project_dir / "sql" / "flows" / "diamond.sql"
    sql.write_text(sql.read_text().replace("timeout => 30", "timeout => 31"))
    code, _, err = cli(capsys, "apply", "--dsn", dsn)
    assert code == 1 and "stale" in err and "sql/flows/diamond.sql" in err
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.flows").fetchone() == (0,)


def test_apply_is_all_or_nothing(dsn: str, project_dir: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "compile")[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('community_threads')")  # takes the alias name
    code, _, err = cli(capsys, "apply", "--dsn", dsn)
    assert code == 1 and "conflicts with flow" in err
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.flows").fetchone() == (1,)
        assert conn.execute("select count(*) from flowlane.aliases").fetchone() == (0,)


def test_plan_needs_a_migrated_database(db_factory: Any, project_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "plan", "--dsn", db_factory("0001"))
    assert code == 1 and "flowlane db migrate" in err


@DB_EXAMPLES
@given(flow_documents())
def test_applying_a_changed_shape_raises_and_changes_nothing(
    conn: psycopg.Connection[Any], document: dict[str, Any],
) -> None:
    document["slug"] = f"imm_{next(_counter)}_{document['slug']}"
    flow = api.project_from_text(to_yaml(document)).flows[0]
    run_file(conn, api.compile_project(api.project_from_text(to_yaml(document)))[
        f"flows/{flow.slug}.sql"])
    # the Python shape and the one SQL derives from the stored definition agree
    stored = conn.execute("select flowlane.get_flow_shape(%s)", (flow.slug,)).fetchone()
    assert stored is not None and shape.same_json(stored[0], shape.flow_shape(flow))
    before = snapshot(conn)
    for mutated in _mutations(document):
        text = api.compile_project(api.project_from_text(to_yaml(mutated)))[
            f"flows/{flow.slug}.sql"]
        with pytest.raises(psycopg.Error, match="FLOWLANE_SHAPE_MISMATCH"):
            run_file(conn, text)
        assert snapshot(conn) == before


@DB_EXAMPLES
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_yaml_strings_round_trip_into_the_database_exactly(
    conn: psycopg.Connection[Any], values: list[str],
) -> None:
    slug = f"strings_{next(_counter)}"
    condition = {f"k{i}{value}": value for i, value in enumerate(values)}
    document = {"kind": "flow", "slug": slug,
                "steps": {"s": {"handler": "m:f", "if": condition, "unless": {"v": values}}}}
    sql = api.compile_project(api.project_from_text(to_yaml(document)))[f"flows/{slug}.sql"]
    run_file(conn, sql)
    stored = conn.execute(
        "select required_input_pattern, forbidden_input_pattern from flowlane.steps "
        "where flow_slug = %s", (slug,)).fetchone()
    assert stored == (condition, {"v": values})


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT, st.booleans())
def test_quoted_literals_mean_the_same_under_any_standard_conforming_strings(
    conn: psycopg.Connection[Any], value: str, conforming: bool,
) -> None:
    conn.execute(f"set standard_conforming_strings = {'on' if conforming else 'off'}")
    conn.execute("set escape_string_warning = off")
    try:
        literal = sqltext.quote(value)
        json_literal = sqltext.jsonb({"v": value})
        row = conn.execute(f"select {literal}::text, {json_literal}").fetchone()
    finally:
        conn.execute("reset standard_conforming_strings")
    assert row == (value, {"v": value})


def test_numeric_conditions_verify_clean_after_apply(dsn: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # PostgreSQL prints 1.5e300 as its 301 digits and 1e3 as 1000.0: the same jsonb values,
    # which plan/verify once called NEW_VERSION_REQUIRED right after a successful apply
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "nums.yaml").write_text(
        "kind: flow\nslug: nums\nsteps:\n  a:\n    handler: m:f\n"
        "    if: {big: 1.5e300, k: 1e3, n: -0.0, i: 99999999999999999999999999}\n")
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "compile")[0] == 0
    code, out, _ = cli(capsys, "apply", "--dsn", dsn)
    assert code == 0, out
    code, out, _ = cli(capsys, "verify", "--dsn", dsn)
    assert code == 0 and "NO_CHANGE             flow nums" in out, out
    assert cli(capsys, "apply", "--dsn", dsn)[0] == 0
