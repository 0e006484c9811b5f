"""Structured worker logging: one line per event, ``event key=value ...``.

Identifiers (run, step, task, attempt, queue, worker) are logged; task
inputs and outputs never are at INFO or above.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

logger = logging.getLogger("flowlane.worker")


def _render(value: Any) -> str:
    text = str(value)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text)
    return text


def event(level: int, name: str, /, exc_info: Any = None, **fields: Any) -> None:
    """Log one event; ``fields`` become ``key=value`` pairs (and ``extra`` for handlers)."""
    if not logger.isEnabledFor(level):
        return
    parts = [name, *(f"{k}={_render(v)}" for k, v in fields.items() if v is not None)]
    logger.log(
        level, " ".join(parts), exc_info=exc_info, extra={"flowlane": {"event": name, **fields}}
    )


class JSONFormatter(logging.Formatter):
    """One JSON object per line, for log shippers (``--log-format json``)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        structured = getattr(record, "flowlane", None)
        if isinstance(structured, dict):
            data.update({k: v for k, v in structured.items() if v is not None})
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send flowlane's logs to stderr (the CLI does; embedding programs configure their own)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        formatter: logging.Formatter = JSONFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger("flowlane")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    quiet_pool_logs()


def quiet_pool_logs() -> None:
    """psycopg_pool warns on every failed reconnection; the worker logs its own events."""
    pool_logger = logging.getLogger("psycopg.pool")
    if pool_logger.level == logging.NOTSET:
        pool_logger.setLevel(logging.ERROR)
