"""The maintenance tick of a process that runs no worker loop (`flowlane serve`, `flowlane ui`):
a thread that calls ``flowlane.maintenance_tick()`` every ``TICK_INTERVAL`` seconds, so that
schedules fire and delayed runs begin while any of them is up. The SQL function is safe with
any number of callers at once: each due schedule slot starts exactly one run. A role that may
not run it (the console role) says so once and leaves the tick to the workers."""

from __future__ import annotations

import sys
import threading

from flowlane import defaults

MAX_RETRY_DELAY = 30.0  # seconds between attempts while the database is unreachable


class Ticker(threading.Thread):
    """Tick until ``stopping`` is set; a database error is reported once per outage and the
    connection is opened again with a growing delay."""

    def __init__(self, dsn: str, stopping: threading.Event, *, who: str,
                 interval: float = defaults.TICK_INTERVAL) -> None:
        super().__init__(name=f"flowlane-{who}-tick", daemon=True)
        self.dsn, self.stopping, self.who, self.interval = dsn, stopping, who, interval

    def run(self) -> None:
        import psycopg

        from flowlane.core import db
        from flowlane.core.queries import query

        target = db.as_target(self.dsn)
        delay = self.interval
        while not self.stopping.is_set():
            try:
                with psycopg.connect(target.conninfo, autocommit=True, **target.connection_kwargs(),
                                     application_name=f"flowlane-{self.who}-tick") as conn:
                    delay = self.interval
                    while not self.stopping.is_set():
                        conn.execute(query("maintenance_tick"))
                        self.stopping.wait(self.interval)
            except psycopg.errors.InsufficientPrivilege as exc:
                print(f"{self.who}: the maintenance tick is left to the workers: "
                      f"{str(exc).strip()}", file=sys.stderr, flush=True)
                return
            except psycopg.Error as exc:
                if delay == self.interval:
                    print(f"{self.who}: maintenance tick failed ({str(exc).strip()}); retrying",
                          file=sys.stderr, flush=True)
                self.stopping.wait(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
