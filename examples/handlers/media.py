"""Handlers of ``flows/per_step.yaml`` (each step polls its own queue)."""

from __future__ import annotations

from typing import Any


def download(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"url": input.get("url", "https://example.com/a.png"), "bytes": 1024}


def resize(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"width": 128, "height": 128, "from_bytes": input["download"]["bytes"]}


def publish(input: Any, ctx: Any = None) -> dict[str, str]:
    return {"published": f"{input['resize']['width']}x{input['resize']['height']}"}
