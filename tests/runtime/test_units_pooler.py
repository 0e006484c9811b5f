"""How a DSN says that it goes through a transaction-mode pooler (``pooler=transaction``), and
what that changes, without a database (tests/runtime/test_pooler.py runs it through pgbouncer)."""

from __future__ import annotations

import json

import pytest

from flowlane import errors
from flowlane.cli import build_parser
from flowlane.cli.worker import worker_config
from flowlane.compiler import project_from_text
from flowlane.core import db
from flowlane.runtime import launch
from flowlane.runtime.serve import plan_workers


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dsn", "conninfo"),
    [
        ("postgresql://app@pgbouncer:6432/flows?pooler=transaction", "postgresql://app@pgbouncer:6432/flows"),
        ("postgresql://app@pgb/flows?sslmode=require&pooler=transaction&application_name=x",
         "postgresql://app@pgb/flows?sslmode=require&application_name=x"),
        ("postgresql://app@pgb/flows?pooler=transaction&sslmode=require",
         "postgresql://app@pgb/flows?sslmode=require"),
        ("host=pgbouncer port=6432 pooler=transaction dbname=flows", "host=pgbouncer port=6432 dbname=flows"),
        ("pooler = 'transaction' host=pgbouncer", "host=pgbouncer"),
    ],
)
def test_the_pooler_parameter_is_read_and_removed_before_libpq_sees_it(dsn: str, conninfo: str) -> None:
    target = db.Target(dsn, "--dsn")
    assert (target.conninfo, target.pooled) == (conninfo, True)
    assert target.connection_kwargs() == {"prepare_threshold": None}  # no server-side prepares


@pytest.mark.slow
@pytest.mark.parametrize("dsn", ["postgresql://app@db/flows?application_name=pooler",
                                 "host=db dbname=pooler", "postgresql://app@db/flows?xpooler=transaction"])
def test_a_dsn_without_the_parameter_is_direct_and_unchanged(dsn: str) -> None:
    target = db.Target(dsn, "--dsn")
    assert (target.conninfo, target.pooled, target.connection_kwargs()) == (dsn, False, {})


def test_an_unknown_pooler_mode_is_refused() -> None:
    with pytest.raises(errors.UsageError, match="unknown pooler=session in the connection string") as caught:
        db.split_pooler("postgresql://app:secret@pgb/flows?pooler=session")
    assert "secret" not in str(caught.value)
    assert "pooler=transaction says that the DSN goes through" in str(caught.value.hint)


def test_migrations_need_a_direct_connection() -> None:
    db.require_direct(db.Target("postgresql://owner@db/flows", "--dsn"), "flowlane db migrate")
    with pytest.raises(errors.UsageError, match="flowlane db migrate needs a direct connection"):
        db.require_direct(db.Target("postgresql://owner@pgb/flows?pooler=transaction", "--dsn"),
                          "flowlane db migrate")


def test_serve_accepts_no_notify_and_hands_it_to_every_worker() -> None:
    served = worker_config(build_parser().parse_args(["serve", "--no-notify"]))
    project = project_from_text("kind: flow\nslug: f\nsteps:\n  s:\n    handler: h:f\n")
    [spec] = plan_workers(project, served)
    assert spec.config.notify is False
    assert json.loads(launch.worker_command(["flows"], spec.config)[3])["config"]["notify"] is False
