"""The poller keeps one connection between its calls, and gives up one that failed."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from flowlane.runtime.store import Store

pytestmark = pytest.mark.slow

PAIRS = [("f", "a")]


async def _claim_backend(store: Store) -> int:
    """The backend the poller's next call runs on, and that call (an empty claim)."""
    async with store._polling() as conn:
        pid = conn.info.backend_pid
    claim = await store.claim_tasks("f", 10, str(uuid.uuid4()), PAIRS)
    assert claim.tasks == []
    return pid


async def _poller_calls(dsn: str) -> list[int | str]:
    store = Store(dsn, application_name="flowlane-test-poller")
    await store.open()
    try:
        seen: list[int | str] = [await _claim_backend(store) for _ in range(3)]
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(%s)", (seen[-1],))
        with pytest.raises(psycopg.OperationalError):
            await store.claim_tasks("f", 10, str(uuid.uuid4()), PAIRS)
        seen.append("failed")
        seen.append(await _claim_backend(store))
        return seen
    finally:
        await store.close()


def test_the_poller_keeps_its_connection_until_a_call_fails(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('f')")
        conn.execute("select flowlane.add_step('f', 'a')")
    first, second, third, failed, after = asyncio.run(_poller_calls(dsn))
    assert first == second == third  # the same backend for every call, not the pool's turn
    assert failed == "failed"
    assert after != first  # a new connection once the old one broke
