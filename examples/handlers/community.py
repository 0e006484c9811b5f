"""Handlers of ``flows/community_threads.yaml`` (both versions share them)."""

from __future__ import annotations

from typing import Any


def fetch(input: Any, ctx: Any = None) -> dict[str, Any]:
    threads = input.get("threads", ["How do I reset my password?"])
    return {"threads": threads, "urgent": bool(input.get("urgent")), "muted": False}


def classify(thread: Any, ctx: Any = None) -> dict[str, str]:
    text = str(thread).lower()
    return {"thread": str(thread), "label": "question" if "?" in text else "other"}


def slack(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"posted": len(input["classify"])}
