"""An alias that adopted the name of a flow (``hello`` over ``hello_v2``, draining
``hello``): every resolution by name in the project means the alias. No database."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane import errors
from flowlane.app.demo import _entry_points
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.runtime.selection import select

YAML = """\
kind: flow
slug: hello
steps:
  greet:
    handler: m:greet
---
kind: flow
slug: hello_v2
queues: {greet: greetings, shout: greetings}
steps:
  greet:
    handler: m:greet
  shout:
    needs: [greet]
    handler: m:shout
---
kind: alias
slug: hello
active: hello_v2
draining: [hello]
---
kind: worker
queue: greetings
flows: [hello]
"""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "flows.yaml").write_text(YAML)
    return api.load_project([tmp_path / "flows.yaml"])


def test_the_name_means_the_alias(project: Project) -> None:
    assert project.resolve("hello").slug == "hello_v2"
    assert [f.slug for f in project.versions("hello")] == ["hello_v2", "hello"]
    assert project.flow("hello").slug == "hello"  # still an immutable version
    assert _entry_points(project) == ["hello"]  # the demo starts the alias, once


def test_workers_named_by_the_alias_serve_every_version_on_their_queue(project: Project) -> None:
    on_own_queue = select(project, queue="hello", flows=["hello"])
    assert {(h.flow_slug, h.step_slug) for h in on_own_queue.handlers} == {("hello", "greet")}
    shared = select(project, name="greetings")
    assert {(h.flow_slug, h.step_slug) for h in shared.handlers} == {
        ("hello_v2", "greet"), ("hello_v2", "shout")}
    with pytest.raises(errors.UsageError, match="route their steps to different queues"):
        select(project, flow="hello")
