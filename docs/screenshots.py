"""Regenerate the console screenshots in docs/ with the browser and data of the console tests.

    .venv/bin/python docs/screenshots.py

Starts a private embedded PostgreSQL, seeds it like tests/ui (runs in every state), serves
`flowlane ui` and lets headless Chromium photograph the main pages into docs/console-*.png.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "ui")]

import ui_support  # noqa: E402

from flowlane.core import db, migrator  # noqa: E402


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="flowlane-screenshots-"))
    try:
        dsn = db.EmbeddedDatabase.start_at(workdir / "data")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrator.ensure_pgmq(conn)
            migrator.migrate(conn)
        seeded = ui_support.seed(dsn)
        with ui_support.ui_server(dsn, "--allow-actions") as server, ui_support.browser(1280, 860) as driver:
            for path in ui_support.screenshots(driver, server.url, seeded, ROOT / "docs"):
                print(f"wrote {path.relative_to(ROOT)}")
    finally:
        db.EmbeddedDatabase.stop_at(workdir / "data")
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
