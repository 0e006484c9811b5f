"""Adversarial YAML: what test_properties.py's random text does not reach.

- Hostile files (alias bombs, nesting past any recursion limit, tens of MB, thousands of
  documents, invalid UTF-8, control characters, unsafe tags) through the real `flowlane validate`
  and `compile` commands, in a child process limited to 1 GiB of address space: the outcome
  is a diagnostic or compiled SQL, never a traceback, a crash or a hang.
- SQL-looking text in every string field of generated documents: a diagnostic, or SQL that a
  real database applies with exactly the YAML's meaning and no side effect.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flowlane import errors
from flowlane.compiler import api
from flowlane.compiler.diagnostics import Diagnostic
from tests.compiler.strategies import flow_documents, to_yaml

pytestmark = pytest.mark.slow  # a memory-limited flowlane process per hostile file


def _bomb(prefix: str, indent: str) -> str:
    levels = [f"{indent}k0: &a0 [x, x, x, x, x, x, x, x, x]\n"]
    levels += [f"{indent}k{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)]
    return prefix + "".join(levels)


STEP = "steps:\n  s:\n    handler: m:f\n"
HOSTILE: dict[str, bytes] = {
    "alias bomb (9^9 references)": _bomb("kind: flow\nslug: bomb\n", "").encode() + STEP.encode(),
    "alias bomb in a condition": _bomb(
        "kind: flow\nslug: bomb\nsteps:\n  s:\n    handler: m:f\n    if:\n", "      ").encode(),
    "recursive alias": b"kind: flow\nslug: r\nsteps: &s\n  s:\n    handler: m:f\n    if: *s\n",
    "merge key loop": b"base: &b\n  <<: *b\n",
    "50,000 nested sequences": b"kind: flow\nslug: d\nsteps: " + b"[" * 50_000 + b"]" * 50_000,
    "20,000 nested mappings": b"kind: flow\nslug: d\nsteps: " + b"{a: " * 20_000 + b"1"
                              + b"}" * 20_000,
    "3,000 nested blocks": b"kind: flow\nslug: d\nsteps:\n" + b"".join(
        b"  " * (i + 1) + f"k{i}:\n".encode() for i in range(3_000)),
    "30 MB description": b"kind: flow\nslug: huge\ndescription: '" + b"x" * 30_000_000
                         + b"'\n" + STEP.encode(),
    "5,000 chained steps": b"kind: flow\nslug: many\nsteps:\n" + b"".join(
        f"  s{i}:\n    handler: m:f\n".encode() + (f"    needs: [s{i - 1}]\n".encode() if i else b"")
        for i in range(5_000)),
    "10,000 documents": b"kind: alias\nslug: a\nactive: b\n---\n" * 10_000,
    "invalid UTF-8": b"kind: flow\nslug: \xff\xfe\xc3\nsteps: {}\n",
    "UTF-16": "kind: flow\nslug: a\nsteps: {}\n".encode("utf-16"),
    "NUL byte": b"kind: flow\nslug: a\x00\nsteps: {}\n",
    "control characters": b"kind: flow\nslug: a\x07b\ndescription: \"\\x1b[31m\\0\"\n"
                          b"steps:\n  s\x0b:\n    handler: m:f\n",
    "bidi override in a slug": "kind: flow\nslug: ab\u202ecd\n".encode() + STEP.encode(),
    "python tag": b"kind: flow\nslug: !!python/object/apply:os.system ['echo pwned']\nsteps: {}\n",
}
MEMORY_LIMIT = 1 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _flowlane(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowlane", *args], cwd=project, capture_output=True, text=True,
        timeout=120, preexec_fn=_limit_memory, check=False)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_give_diagnostics_in_bounded_time_and_memory(
    tmp_path: Path, case: str
) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "hostile.yaml").write_bytes(HOSTILE[case])
    for command in (["validate"], ["compile", "--out", "sql"]):
        result = _flowlane(tmp_path, *command)
        output = result.stdout + result.stderr
        assert "Traceback" not in output and "MemoryError" not in output, output[-3000:]
        if result.returncode == 1:
            assert "error[FL" in output and "hostile.yaml:" in output, output[-3000:]
        else:
            assert result.returncode == 0, output[-3000:]


SQL_PAYLOADS = st.sampled_from([
    "'); create table public.pwned (); --",
    "$$; create table public.pwned (); $$",
    "\\'; create table public.pwned (); --",
    "E'\\\\'; create table public.pwned (); --",
    "*/ create table public.pwned (); /*",
    "\n; create table public.pwned (); --",
    "$fl$ create table public.pwned (); $fl$",
    "\"; create table public.pwned (); --",
    "' || (select string_agg(rolname, ',') from pg_roles) || '",
    "\\x27; create table public.pwned (); --",
    "\u2019; create table public.pwned (); --",
])


@st.composite
def poisoned(draw: st.DrawFn, slug: str) -> tuple[str, list[Any]]:
    """A valid flow (with an alias or a worker document when the target is theirs) with one
    string replaced by SQL-looking text."""
    flow = draw(flow_documents(slug=slug))
    steps = list(flow["steps"])
    step = draw(st.sampled_from(steps))
    alias = {"kind": "alias", "slug": f"{slug}_alias", "active": slug}
    worker = {"kind": "worker", "name": f"{slug}_w", "queue": "q", "flows": [slug]}
    payload = draw(SQL_PAYLOADS)
    targets: dict[str, Callable[[], None]] = {
        "flow slug": lambda: flow.update(slug=payload),
        "description": lambda: flow.update(description=payload),
        "step slug": lambda: flow.update(steps={payload: flow["steps"].pop(step),
                                                **flow["steps"]}),
        "handler": lambda: flow["steps"][step].update(handler=payload),
        "handler callable": lambda: flow["steps"][step].update(handler=f"m:{payload}"),
        "needs": lambda: flow["steps"][step].update(needs=[payload]),
        "when_unmet": lambda: flow["steps"][step].update({"if": {"k": 1}, "when_unmet": payload}),
        "condition value": lambda: flow["steps"][step].update({"if": {"k": payload}}),
        "condition key": lambda: flow["steps"][step].update({"unless": {payload: [payload]}}),
        "queue": lambda: flow.update(queues={s: payload for s in steps}),
        "alias slug": lambda: alias.update(slug=payload),
        "alias target": lambda: alias.update(active=payload),
        "worker name": lambda: worker.update(name=payload),
        "worker queue": lambda: worker.update(queue=payload),
    }
    where = draw(st.sampled_from(sorted(targets)))
    targets[where]()
    extra = [alias] if where.startswith("alias") else [worker] if where.startswith("worker") else []
    return where, [flow, *extra]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_sql_looking_text_in_any_field_is_a_diagnostic_or_inert_data(
    conn: psycopg.Connection[Any], data: st.DataObject
) -> None:
    slug = f"f{uuid.uuid4().hex[:10]}"
    where, documents = data.draw(poisoned(slug))
    text = "\n---\n".join(to_yaml(d) for d in documents)
    found = api.validate_text(text, "poisoned.yaml")
    assert all(isinstance(d, Diagnostic) for d in found)
    if found:
        event(f"{where}: diagnostic")
        return
    event(f"{where}: applied")
    try:
        files = api.compile_project(api.project_from_text(text, "poisoned.yaml"))
    except errors.FlowlaneError as exc:  # e.g. a route the compiler refuses
        assert str(exc)
        return
    for _name, sql in sorted(files.items(), key=lambda item: "alias" in item[0]):
        conn.execute(sql.encode())  # package quoting, vouched for by this very test
    assert conn.execute("select to_regclass('public.pwned')").fetchone() == (None,), where
    shape = conn.execute("select flowlane.get_flow_shape(%s)", (slug,)).fetchone()
    assert shape is not None and shape[0] is not None, where
    for step_slug, spec in documents[0]["steps"].items():
        same = conn.execute(  # jsonb equality: 1e16 written, 10000000272564224 stored
            "select required_input_pattern is not distinct from %s::jsonb"
            " and forbidden_input_pattern is not distinct from %s::jsonb"
            " from flowlane.steps where flow_slug = %s and step_slug = %s",
            (json_or_null(spec.get("if")), json_or_null(spec.get("unless")), slug, step_slug),
        ).fetchone()
        assert same == (True,), (where, step_slug)


def json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
