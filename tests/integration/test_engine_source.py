"""The engine source (flowlane/core/engine) and the migrations build the same database, and
the drafting tool turns a change of the source into the migration that catches up."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from flowlane import errors
from flowlane.core import draft_migration, engine_source, schema_dump
from tests.conftest import Cluster

ENGINE_DIR = Path(engine_source.__file__).with_name("engine")


def _built_from_source(db_factory: Callable[..., str], source_dir: Path | None = None) -> str:
    dsn = db_factory("none")
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine_source.build(conn, source_dir)
    return dsn


@pytest.mark.slow
def test_a_database_built_from_the_source_equals_one_built_from_the_migrations(
    db_factory: Callable[..., str],
) -> None:
    migrated, built = db_factory(), _built_from_source(db_factory)
    assert schema_dump.dump(built) == schema_dump.dump(migrated), (
        "the engine source and the migrations differ: "
        "draft a migration with `python -m flowlane.core.draft_migration NAME`")
    assert draft_migration.difference(migrated, built).empty


def test_each_function_is_defined_once_in_the_source() -> None:
    functions = engine_source.functions()
    assert "claim_tasks" in functions and "_complete_batch" in functions
    text = "\n".join(f.sql for f in engine_source.files())
    created = re.findall(r"^create (?:or replace )?function ", text, re.MULTILINE | re.IGNORECASE)
    assert len(created) == len(functions)


@pytest.fixture
def source_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "engine"
    shutil.copytree(ENGINE_DIR, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.mark.slow
def test_a_changed_function_is_drafted_and_the_draft_brings_the_migrations_to_the_source(
    db_factory: Callable[..., str], source_copy: Path,
) -> None:
    fleet = source_copy / "09_fleet.sql"
    where = "w.last_heartbeat_at)\n     where w.worker_id = heartbeat.worker_id"
    _edit(fleet, f"greatest(flowlane._now(), {where}", f"greatest(flowlane._clock_timestamp(), {where}")
    _edit(fleet, "function flowlane.mark_worker_stopped(worker_id uuid)",
          "function flowlane.mark_worker_stopped(worker_id uuid, reason text = null)")
    migrated, built = db_factory(), _built_from_source(db_factory, source_copy)
    found = draft_migration.difference(migrated, built)
    assert sorted(found.created) == ["heartbeat", "mark_worker_stopped"]
    assert found.dropped == ["flowlane.mark_worker_stopped(uuid)"]
    assert not found.flagged
    text = draft_migration.draft(found, "worker_clock", "0099", source_copy)
    assert "create or replace function flowlane.heartbeat(" in text
    assert "drop function flowlane.mark_worker_stopped(uuid);" in text
    with psycopg.connect(migrated, autocommit=True) as conn, conn.transaction():
        conn.execute(text)
    assert schema_dump.dump(migrated) == schema_dump.dump(built)


@pytest.mark.slow
def test_a_dropped_signature_that_other_functions_call_is_flagged_with_its_callers(
    db_factory: Callable[..., str], source_copy: Path,
) -> None:
    # a call in flight when the migration commits runs the callers' old bodies, which still
    # call the old signature
    hide = "function flowlane._hide_claimed(p_claimed flowlane.step_tasks[], p_read_vt int"
    _edit(source_copy / "05_claim.sql", f"{hide})", f"{hide}, p_note text = null)")
    found = draft_migration.difference(db_factory(), _built_from_source(db_factory, source_copy))
    old = "flowlane._hide_claimed(flowlane.step_tasks[],integer)"
    assert found.dropped == [old]
    assert found.called_by == {old: [
        "flowlane._claim_one(text,bigint,uuid,text[],text[],integer,timestamp with time zone)",
        "flowlane._start_tasks(text,bigint[],uuid,text[],text[],integer,timestamp with time zone)"]}
    text = draft_migration.draft(found, "hide_note", "0099", source_copy)
    assert (f"{draft_migration.REVIEW} {old} is called by flowlane._claim_one(") in text
    assert text.index(draft_migration.REVIEW) < text.index(f"drop function {old};")


@pytest.mark.slow
def test_a_function_the_source_writes_at_run_time_is_flagged_with_what_writes_it(
    db_factory: Callable[..., str], source_copy: Path,
) -> None:
    _edit(source_copy / "02_queues.sql", "$r$return pgmq.archive(p_queue, p_msg_id);$r$",
          "$r$return coalesce(pgmq.archive(p_queue, p_msg_id), false);$r$")
    found = draft_migration.difference(db_factory(), _built_from_source(db_factory, source_copy))
    assert sorted(found.created) == ["_queue_archive", "_write_queue_ops"]
    text = draft_migration.draft(found, "archive_false", "0099", source_copy)
    assert "create or replace function flowlane._write_queue_ops(" in text
    assert ("-- written at run time by the source, by a function that the part written by hand below "
            "calls: _queue_archive") in text


@pytest.mark.slow
def test_a_redraft_rewrites_only_the_drafted_part_of_the_pending_migration(
    db_factory: Callable[..., str], source_copy: Path,
) -> None:
    where = "w.last_heartbeat_at)\n     where w.worker_id = heartbeat"
    _edit(source_copy / "09_fleet.sql", f"greatest(flowlane._now(), {where}",
          f"greatest(flowlane._clock_timestamp(), {where}")
    found = draft_migration.difference(db_factory(), _built_from_source(db_factory, source_copy))
    before = "alter table flowlane.rollouts add column note text;"
    after = "update flowlane.rollouts set note = '';"
    stale = "create or replace function flowlane.stale() returns int;"
    parts = ["-- 0099: notes.", draft_migration.BEFORE, before, draft_migration.DRAFTED, stale,
             draft_migration.AFTER, after]
    pending = "\n\n".join(parts) + "\n"
    text = draft_migration.redraft(pending, found, source_copy)
    heartbeat = text.index("create or replace function flowlane.heartbeat(")
    assert text.index(before) < heartbeat < text.index(after)
    assert "flowlane.stale" not in text
    assert draft_migration.redraft(text, found, source_copy) == text
    with pytest.raises(errors.MigrationError, match="lost its part markers"):
        draft_migration.redraft(pending.replace(draft_migration.AFTER, ""), found, source_copy)


@pytest.mark.slow
def test_a_table_change_is_flagged_for_a_person_and_check_fails_until_it_is_written(
    cluster: Cluster, db_factory: Callable[..., str], source_copy: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _edit(source_copy / "01_tables.sql", "  rollout_id bigint not null generated always as identity,\n",
          "  rollout_id bigint not null generated always as identity,\n  note text,\n")
    found = draft_migration.difference(db_factory(), _built_from_source(db_factory, source_copy))
    assert list(found.flagged) == ["TABLE rollouts"] and not found.created and not found.dropped
    text = draft_migration.draft(found, "rollout_note", "0099", source_copy)
    assert f"{draft_migration.FLAG} TABLE rollouts (changed)" in text
    assert "--   +    note text," in text
    assert "alter table" not in text.lower()
    assert draft_migration.main(["--check", "--dsn", cluster.admin_dsn, "--source", str(source_copy)]) == 1
    assert "by hand: TABLE rollouts" in capsys.readouterr().err
    assert draft_migration.main(["--check", "--dsn", cluster.admin_dsn]) == 0


@pytest.mark.slow
def test_a_source_that_does_not_build_is_reported_by_file_and_leaves_nothing_half_built(
    cluster: Cluster, db_factory: Callable[..., str], source_copy: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with (source_copy / "10_console.sql").open("a", encoding="utf-8") as file:
        file.write("\ncreate function flowlane.unfinished( returns int;\n")
    assert draft_migration.main(["--check", "--dsn", cluster.admin_dsn, "--source", str(source_copy)]) == 1
    assert "engine source 10_console.sql failed: syntax error" in capsys.readouterr().err
    dsn = db_factory("none")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(errors.MigrationError, match=r"10_console\.sql"):
            engine_source.build(conn, source_copy)
        assert conn.execute("select to_regclass('flowlane.runs')").fetchone() == (None,)
