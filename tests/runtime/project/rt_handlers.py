"""Handlers of the runtime test flows (imported by real worker processes).

Handlers that coordinate with a test take a directory in the run input
(``{"dir": ...}``) and talk through files in it: ``started-<run>-<attempt>``
marks a claim, ``release`` lets ``hold`` return, ``record.log`` counts
executions of the dependent step.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from flowlane.runtime import TaskContext


def split(input: dict[str, Any], ctx: TaskContext) -> list[int]:
    return list(ctx.flow_input["numbers"])


def square(n: int, ctx: TaskContext) -> int:
    return n * n


def meta(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    numbers = input["split"]
    return {"count": len(numbers), "big": len(numbers) > 3}


def total(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"sum_of_squares": sum(input["square"]), "count": input["meta"]["count"]}


async def alert(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"alerted": True, "count": input["meta"]["count"]}


def flaky(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    if ctx.attempt < 3:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"succeeded_on_attempt": ctx.attempt}


def boom(input: dict[str, Any], ctx: TaskContext) -> None:
    raise ValueError(f"boom on attempt {ctx.attempt}")


def after(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"saw": sorted(input)}


def first(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"pid": os.getpid(), "value": ctx.flow_input["value"]}


def second(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"pid": os.getpid(), "value": input["first"]["value"] + 1}


def after_one(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"pid": os.getpid(), "value": input["one"]["value"] + 1}


def third(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"pid": os.getpid(), "value": input["second"]["value"] * 10}


def hold(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Mark the claim, then wait for ``release`` (only on attempt 1 when ``only_first`` is set)."""
    folder = Path(ctx.flow_input["dir"])
    (folder / f"started-{ctx.run_id}-{ctx.attempt}").write_text(str(os.getpid()))
    must_wait = ctx.attempt == 1 or not ctx.flow_input.get("only_first")
    deadline = time.monotonic() + 60
    while must_wait and not (folder / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        ctx.shutdown.wait(0.02)  # a handler polling for its condition
    if ctx.attempt == 1 and ctx.flow_input.get("fail_first"):
        raise RuntimeError("the first attempt fails once released")
    return {"attempt": ctx.attempt, "pid": os.getpid(), "saw_shutdown": ctx.shutdown.is_set()}


def record(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    folder = Path(ctx.flow_input["dir"])
    with (folder / "record.log").open("a") as log:
        log.write(f"{ctx.run_id} {ctx.attempt} {input['hold']['attempt']}\n")
    return {"from_attempt": input["hold"]["attempt"]}


def noop(input: Any, ctx: TaskContext) -> list[int]:
    return list(range(int(ctx.flow_input.get("width", 2))))


async def async_noop(item: Any, ctx: TaskContext) -> Any:
    return item


def bad_output(input: Any, ctx: TaskContext) -> Any:
    return {"not json": {1, 2, 3}}


GAUGE = {"now": 0, "peak": 0}
_GAUGE_LOCK = threading.Lock()


def gauge(item: Any, ctx: TaskContext) -> int:
    """Count handlers running at once; each waits until a few others have started too."""
    with _GAUGE_LOCK:
        GAUGE["now"] += 1
        GAUGE["peak"] = max(GAUGE["peak"], GAUGE["now"])
    try:
        deadline = time.monotonic() + 2
        while GAUGE["peak"] < 3 and time.monotonic() < deadline:
            ctx.shutdown.wait(0.005)
        return int(item)
    finally:
        with _GAUGE_LOCK:
            GAUGE["now"] -= 1


async def hold_async(input: Any, ctx: TaskContext) -> dict[str, Any]:
    """Mark the claim, then wait (asynchronously) for the worker to stop."""
    (Path(ctx.flow_input["dir"]) / f"started-{ctx.run_id}-{ctx.attempt}").write_text("")
    stopped = await ctx.wait_shutdown(60)
    return {"saw_shutdown": stopped}


def greet_v1(input: Any, ctx: TaskContext) -> str:
    return f"hello {ctx.flow_input['name']}"


def greet_v2(input: Any, ctx: TaskContext) -> str:
    return f"Hello, {ctx.flow_input['name']}!"


def shout(input: dict[str, Any], ctx: TaskContext) -> str:
    return str(input["greet"]).upper()


def nul_error(input: Any, ctx: TaskContext) -> None:
    raise ValueError("binary\x00garbage")


class _Opaque:
    pass


def _misbehaviour(mode: str) -> Any:
    """What the ``misbehave`` handlers do for ``flow_input["mode"]``."""
    if mode == "system_exit":
        raise SystemExit(3)
    if mode == "keyboard_interrupt":
        raise KeyboardInterrupt
    if mode == "generator_exit":
        raise GeneratorExit
    if mode == "stop_iteration":
        raise StopIteration("no more")
    if mode == "nan":
        return {"value": float("nan")}
    if mode == "infinity":
        return [float("inf")]
    if mode == "set":
        return {1, 2}
    if mode == "object":
        return _Opaque()
    if mode == "bytes":
        return b"raw"
    if mode == "lone_surrogate":
        return "half \ud800 a pair"
    if mode == "huge":
        return {"blob": "x" * 5_000_000, "items": list(range(100_000))}
    return {"mode": mode}


def misbehave(input: Any, ctx: TaskContext) -> Any:
    return _misbehaviour(ctx.flow_input["mode"])


async def misbehave_async(input: Any, ctx: TaskContext) -> Any:
    return _misbehaviour(ctx.flow_input["mode"])


def prep(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    with (Path(ctx.flow_input["dir"]) / "prep.log").open("a") as log:
        log.write(f"{ctx.run_id} {ctx.attempt}\n")
    return {"prepared": True}


def gate(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    if not (Path(ctx.flow_input["dir"]) / "open").exists():
        raise PermissionError(f"gate closed on attempt {ctx.attempt}")
    return {"passed_on_attempt": ctx.attempt, "prep": input["prep"]}


def suicide(input: Any, ctx: TaskContext) -> None:
    """Kill the worker process running it (a stall with no result, every attempt)."""
    os.kill(os.getpid(), 9)


def fan(input: Any, ctx: TaskContext) -> list[int]:
    return list(range(int(ctx.flow_input.get("width", 0))))


def _record(ctx: TaskContext) -> None:
    """Append one line per execution to ``<dir>/exec-<pid>.log`` (small O_APPEND writes)."""
    folder = ctx.flow_input.get("dir")
    if folder:
        line = f"{ctx.run_id} {ctx.step_slug} {ctx.task_index} {ctx.attempt}\n"
        with (Path(folder) / f"exec-{os.getpid()}.log").open("a") as log:
            log.write(line)


def recorded_item(item: int, ctx: TaskContext) -> int:
    _record(ctx)
    return item


def recorded_side(input: dict[str, Any], ctx: TaskContext) -> int:
    _record(ctx)
    return len(input["fan"])


def recorded_join(input: dict[str, Any], ctx: TaskContext) -> int:
    _record(ctx)
    return sum(input["item"]) + input["side"]


def deep_output(input: Any, ctx: TaskContext) -> Any:
    """An output nested past json.dumps' recursion limit (and past flowlane's 100 levels)."""
    value: Any = 1
    for _ in range(int(ctx.flow_input.get("depth", 5000))):
        value = [value]
    return value


def big_item(item: int, ctx: TaskContext) -> str:
    """``item`` MB of text: 90 x 3 MB outputs exceed jsonb's 255 MB when the map aggregates them."""
    return "x" * (int(item) * 1_000_000)


def _crash_record(ctx: TaskContext) -> None:
    """One line per execution, written before the work: a killed execution still counts."""
    line = f"{ctx.run_id} {ctx.step_slug} {ctx.task_index} {ctx.attempt}\n"
    with (Path(ctx.flow_input["dir"]) / f"exec-{os.getpid()}.log").open("a") as log:
        log.write(line)


def crash_fan(input: Any, ctx: TaskContext) -> list[int]:
    _crash_record(ctx)
    return list(range(int(ctx.flow_input["width"])))


def crash_work(input: Any, ctx: TaskContext) -> dict[str, Any]:
    """``work`` seconds of work that does not look at ``ctx.shutdown`` (a long handler)."""
    _crash_record(ctx)
    time.sleep(float(ctx.flow_input.get("work", 0)))  # the handler's workload, not a wait
    return {"step": ctx.step_slug, "index": ctx.task_index}


def crash_join(input: dict[str, Any], ctx: TaskContext) -> int:
    _crash_record(ctx)
    return len(input["item"])


FUZZ_SPECIALS: dict[str, Any] = {
    "none": None, "nan": float("nan"), "inf": float("-inf"), "nul": "a\x00b",
    "surrogate": "half \udc00", "bytes": b"raw",
}


def fuzz_value(recipe: dict[str, Any]) -> Any:
    """``[text * repeat, special]`` wrapped in ``depth`` objects (tests compute it too)."""
    value: Any = [str(recipe["text"]) * int(recipe["repeat"]), FUZZ_SPECIALS[recipe["special"]]]
    for _ in range(int(recipe["depth"])):
        value = {"d": value}
    return value


def fuzz_output(input: Any, ctx: TaskContext) -> Any:
    return fuzz_value(ctx.flow_input)


def deadline(input: Any, ctx: TaskContext) -> str | None:
    return ctx.deadline.isoformat() if ctx.deadline else None
def contract_output(input: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Breaks its step's output_schema when asked (``total`` below its minimum)."""
    return {"total": 3 if input["mode"] == "good" else -1}


def tally(input: Any, ctx: TaskContext) -> dict[str, Any]:
    """One line per execution in executions.log; the output names the execution."""
    log = Path(ctx.flow_input["dir"]) / "executions.log"
    with log.open("a") as lines:
        lines.write(f"{ctx.step_slug}\n")
    return {"step": ctx.step_slug, "execution": len(log.read_text().splitlines())}
