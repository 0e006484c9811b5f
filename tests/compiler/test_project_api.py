"""The public API the worker runtime uses: load_project and the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane import errors, load_project
from flowlane.compiler import api

ROOT = Path(__file__).resolve().parents[2]


def test_project_load_exposes_flows_aliases_workers_and_handlers() -> None:
    project = load_project(ROOT / "flows")
    v2 = project.flow("community_threads_v2")
    assert [s.slug for s in v2.steps] == ["fetch", "classify", "deliver_slack"]
    assert v2.queue_mode == "explicit" and v2.owned_queues == ()
    assert v2.step("classify").type == "map" and v2.step("classify").timeout == 120
    assert v2.step("deliver_slack").condition_if == {"classify": [{"label": "question"}]}
    assert project.resolve("community_threads").slug == "community_threads_v2"
    assert [f.slug for f in project.versions("community_threads")] == [
        "community_threads_v2", "community_threads_v1"]
    worker = next(w for w in project.workers if w.name == "classify")
    assert (worker.queue, worker.max_concurrent, worker.batch_size) == ("classify_threads", 4, 10)
    pairs = project.routed_pairs("classify_threads", worker.flows)
    assert pairs == {("community_threads_v2", "fetch"), ("community_threads_v2", "classify"),
                     ("community_threads_v1", "fetch"), ("community_threads_v1", "classify"),
                     ("forum_digest", "collect"), ("forum_digest", "summarise")}
    refs = project.handlers("classify_threads", ["community_threads"])
    assert refs[0].handler == "examples.handlers.community:fetch"
    assert refs[0].location is not None and refs[0].location.path.endswith(
        "flows/community_threads.yaml")
    hello = project.flow("hello_world")
    assert hello.owned_queues == ("hello_world",)
    assert hello.steps[0].handler == "examples.handlers.hello:greet"


def test_project_load_takes_one_path_as_text_or_several() -> None:
    one = load_project(str(ROOT / "flows"))
    assert one == load_project([ROOT / "flows"]) == load_project(ROOT / "flows")
    assert load_project([ROOT / "flows" / "hello_world.yaml"]).flows == (one.flow("hello_world"),)


def test_project_load_raises_compile_error_with_diagnostics(tmp_path: Path) -> None:
    (tmp_path / "f.yaml").write_text("kind: flow\nslug: x\nsteps:\n  a: {handler: m}\n")
    with pytest.raises(errors.CompileError) as exc:
        load_project(tmp_path)
    assert [d.code for d in exc.value.diagnostics] == ["FL070"]
    assert "error[FL070]" in str(exc.value)


def test_per_step_queue_names_fall_back_to_the_step_index() -> None:
    slug = "a" * 40
    project = api.project_from_text(
        f"kind: flow\nslug: {slug}\nqueues: per-step\nsteps:\n"
        "  ab: {handler: m:f}\n  abcdefgh: {handler: m:f, needs: [ab]}\n")
    assert [s.queue for s in project.flows[0].steps] == [f"{slug}__ab", f"{slug}__1"]
