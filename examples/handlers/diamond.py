"""Handlers of ``flows/diamond.yaml``: a map fan-out, a fan-in and a conditional step.

The types come from the flow's contracts (``flowlane types flows --out examples/flowtypes.py``):
mypy checks each handler against the YAML's ``input_schema`` and ``output_schema``."""

from __future__ import annotations

from typing import Any

from examples.flowtypes import (
    DiamondDescribeHandlerInput,
    DiamondDescribeOutput,
    DiamondNotifyHandlerInput,
    DiamondNotifyOutput,
    DiamondSplitHandlerInput,
    DiamondSplitOutput,
    DiamondSquareHandlerInput,
    DiamondSquareOutput,
    DiamondTotalHandlerInput,
    DiamondTotalOutput,
)


def split(input: DiamondSplitHandlerInput, ctx: Any = None) -> DiamondSplitOutput:
    return [int(n) for n in input["numbers"]]


def square(item: DiamondSquareHandlerInput, ctx: Any = None) -> DiamondSquareOutput:
    return item * item


def describe(input: DiamondDescribeHandlerInput, ctx: Any = None) -> DiamondDescribeOutput:
    return {"count": len(input["split"])}


def total(input: DiamondTotalHandlerInput, ctx: Any = None) -> DiamondTotalOutput:
    value = sum(input["square"])
    return {"total": value, "count": input["describe"]["count"], "notify": value > 100}


def notify(input: DiamondNotifyHandlerInput, ctx: Any = None) -> DiamondNotifyOutput:
    return {"message": f"total is {input['total']['total']}"}
