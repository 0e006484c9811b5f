"""Handlers of ``flows/community_threads.yaml`` (both versions share them) and of
``flows/forum_digest.yaml`` (the same shared queue)."""

from __future__ import annotations

from typing import Any


def fetch(input: Any, ctx: Any = None) -> list[str]:
    # `classify` is a map over this step, so the output must be a JSON array (an object
    # fails the run with TYPE_VIOLATION); `deliver_slack`'s conditions test the array
    # of `classify` outputs instead.
    return [str(t) for t in input.get("threads", ["How do I reset my password?"])]


def classify(thread: Any, ctx: Any = None) -> dict[str, str]:
    text = str(thread).lower()
    if "buy now" in text:
        return {"thread": str(thread), "label": "spam"}
    return {"thread": str(thread), "label": "question" if "?" in text else "other"}


def slack(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"posted": len(input["classify"])}


def collect(input: Any, ctx: Any = None) -> list[str]:
    return [str(p) for p in input.get("posts", [])]


def summarise(input: Any, ctx: Any = None) -> dict[str, int]:
    posts = input["collect"]
    return {"posts": len(posts), "questions": sum("?" in p for p in posts)}
