"""What an input_schema costs at start: start_flows of a flow with a realistic contract against
the same flow without one, in one run.

    python benchmarks/contract_starts.py [--runs 2000] [--batch 100] [--rounds 5]

One embedded PostgreSQL, one database migrated to head, two one-step flows that differ only in
their contract: `bench_plain` (none) and `bench_contract` (an input_schema of 10 fields: strings
with a pattern and a length, an enum, bounded numbers, a boolean, an array of strings and an
array of 5 objects of 3 fields each). Both get the same inputs, valid under the schema. Each
call is its own autocommit transaction on one connection, cells interleaved in --rounds rounds
with a rotating order (a shared machine's load hits all alike). Printed per cell: runs/s, the
backend's CPU per run (/proc/<pid>/schedstat) and the contract's cost as a ratio to the plain
flow; then the same for single start_flow calls (--runs / 10 per round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import backend_cpu_ns, migrated_database, statements_server
from flowlane.compiler import api, compiled

SCHEMA = {
    "type": "object",
    "required": ["order_id", "customer", "email", "currency", "total", "priority", "lines"],
    "additionalProperties": False,
    "properties": {
        "order_id": {"type": "string", "pattern": "^ord_[0-9]+$"},
        "customer": {"type": "string", "minLength": 1, "maxLength": 64},
        "email": {"type": "string", "maxLength": 254},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "total": {"type": "number", "minimum": 0},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "express": {"type": "boolean"},
        "notes": {"type": "string", "maxLength": 500},
        "tags": {"type": "array", "maxItems": 10, "items": {"type": "string"}},
        "lines": {
            "type": "array", "minItems": 1, "maxItems": 100,
            "items": {
                "type": "object", "required": ["sku", "quantity", "price"],
                "properties": {
                    "sku": {"type": "string", "minLength": 1},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number", "minimum": 0},
                },
            },
        },
    },
}
FLOWS = f"""
kind: flow
slug: bench_plain
steps:
  s0: {{handler: bench.h:s0}}
---
kind: flow
slug: bench_contract
input_schema: {json.dumps(SCHEMA)}
steps:
  s0: {{handler: bench.h:s0}}
"""


def order(n: int) -> dict[str, Any]:
    lines = [{"sku": f"sku-{n}-{i}", "quantity": 1 + i, "price": 9.5 + i} for i in range(5)]
    return {"order_id": f"ord_{n}", "customer": f"customer {n}", "email": f"c{n}@example.com",
            "currency": "EUR", "total": sum(x["quantity"] * x["price"] for x in lines),
            "priority": 1 + n % 5, "express": n % 2 == 0, "notes": "leave at the door",
            "tags": ["web", "returning"], "lines": lines}


def many(conn: psycopg.Connection[Any], flow: str, inputs: list[Jsonb], batch: int) -> None:
    for start in range(0, len(inputs), batch):
        conn.execute("select count(*) from flowlane.start_flows(%s, %s::jsonb[])",
                     (flow, inputs[start:start + batch]))


def single(conn: psycopg.Connection[Any], flow: str, inputs: list[Jsonb], _batch: int) -> None:
    for value in inputs:
        conn.execute("select (flowlane.start_flow(%s, %s)).run_id", (flow, value))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per start_flows cell and round")
    parser.add_argument("--batch", type=int, default=100, help="inputs per start_flows call")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()
    inputs = [Jsonb(order(n)) for n in range(args.runs)]
    with statements_server("flowlane-bench-contracts-") as admin:
        conn = migrated_database(admin, "bench_contracts", None)
        for flow in api.project_from_text(FLOWS).flows:
            conn.execute(compiled.render_flow(flow).encode())
        pid = conn.info.backend_pid
        cells = [(way, flow) for way in ("start_flows", "start_flow")
                 for flow in ("bench_plain", "bench_contract")]
        wall: dict[tuple[str, str], list[float]] = {c: [] for c in cells}
        cpu: dict[tuple[str, str], list[float]] = {c: [] for c in cells}
        for round_ in range(args.rounds):
            for way, flow in cells[round_ % len(cells):] + cells[:round_ % len(cells)]:
                chosen = inputs if way == "start_flows" else inputs[: max(1, args.runs // 10)]
                call = many if way == "start_flows" else single
                before_cpu, before = backend_cpu_ns(pid), time.perf_counter()
                call(conn, flow, chosen, args.batch)
                wall[(way, flow)].append((time.perf_counter() - before) / len(chosen))
                cpu[(way, flow)].append((backend_cpu_ns(pid) - before_cpu) / len(chosen))
        conn.close()
    print(f"{args.runs} runs per start_flows cell (batches of {args.batch}), {args.runs // 10} single "
          f"starts per cell, {args.rounds} rounds; medians")
    print(f"{'cell':<30} {'runs/s':>9} {'CPU us/run':>11} {'wall x plain':>13} {'CPU x plain':>12}")
    for way, flow in cells:
        w, c = statistics.median(wall[(way, flow)]), statistics.median(cpu[(way, flow)])
        w0, c0 = statistics.median(wall[(way, "bench_plain")]), statistics.median(cpu[(way, "bench_plain")])
        print(f"{way + ' ' + flow:<30} {1 / w:>9.0f} {c / 1000:>11.1f} {w / w0:>13.2f} {c / c0:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
