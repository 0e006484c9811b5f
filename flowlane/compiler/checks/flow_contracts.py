"""A flow's data contracts: read once, and held against its conditions, maps and keys."""

from __future__ import annotations

from typing import Any

from flowlane.compiler import codes, contracts
from flowlane.compiler.checks.flow_document import FlowDocument


class FlowContracts:
    """The contracts of one flow document (its input_schema, its steps' output_schema), and
    the checks of what they decide."""

    def __init__(self, flow: FlowDocument) -> None:
        self.flow = flow
        self.input_contract: contracts.Contract | None = None
        self.output_contracts: dict[str, contracts.Contract] = {}
        if "input_schema" in flow.entry.data:
            self.input_contract = self._contract(("input_schema",), flow.entry.data["input_schema"])
        for slug, spec in flow.steps.items():
            if isinstance(spec, dict) and "output_schema" in spec:
                found = self._contract(("steps", slug, "output_schema"), spec["output_schema"])
                if found is not None:
                    self.output_contracts[slug] = found

    def _contract(self, path: tuple[str | int, ...], value: Any) -> contracts.Contract | None:
        found, problems = contracts.read(self.flow.doc, path, value)
        self.flow.errors += len(problems)
        self.flow.state.findings.extend(problems)
        return found

    def seen_as(self, need: str) -> dict[str, Any] | None:
        """The schema of what a later step sees of ``need`` (a map step: the array of its
        task outputs), None when it has no contract."""
        found = self.output_contracts.get(need)
        if found is None:
            return None
        spec = self.flow.steps[need]
        return contracts.as_map_output(found.schema) if spec.get("type") == "map" else found.schema

    def check_graph(self, needs: dict[str, list[str]]) -> None:
        """Conditions and maps checked against the contracts of what they test or map."""
        for slug, spec in self.flow.steps.items():
            if spec.get("type") == "map":
                self._map_source(slug, needs[slug])
            for keyword in ("if", "unless"):
                condition = spec.get(keyword)
                if isinstance(condition, dict):
                    self._condition_contract(slug, keyword, condition, needs[slug])

    def check_concurrency_keys(self) -> None:
        """A concurrency key the input_schema says is never present puts every run (or task)
        in the one bucket `null`: a misspelt pointer, refused."""
        schema = self.input_contract.schema if self.input_contract else None
        if schema is None:
            return
        places: list[tuple[tuple[str | int, ...], Any]] = [
            (("concurrency",), self.flow.entry.data.get("concurrency"))]
        places += [(("steps", slug, "concurrency"), spec.get("concurrency"))
                   for slug, spec in self.flow.steps.items() if isinstance(spec, dict)]
        places.append((("debounce",), self.flow.entry.data.get("debounce")))
        for path, concurrency in places:
            key = concurrency.get("key") if isinstance(concurrency, dict) else None
            reason = contracts.never_present(schema, key) if isinstance(key, str) else None
            if reason:
                self.flow.error((*path, "key"), codes.CONCURRENCY_KEY_NEVER_PRESENT,
                                f"{path[-1]} key `{key}` never has a value: by the input_schema, {reason}",
                                "point at a field of the run input (every run would share the key null)")

    def _map_source(self, slug: str, needs: list[str]) -> None:
        if needs:
            mapped, what = self.seen_as(needs[0]), f"the output of `{needs[0]}`"
        else:
            mapped = self.input_contract.schema if self.input_contract else None
            what = "the run input"
        if mapped is not None and contracts.not_an_array(mapped):
            self.flow.error(("steps", slug, "type"), codes.MAP_OVER_NON_ARRAY,
                            f"map step `{slug}` maps {what}, whose schema is never an array "
                            f"(type {contracts.declared_types(mapped)})",
                            "map over a step whose output_schema is an array (`type: array`), or make "
                            "this a single step")

    def _condition_contract(self, slug: str, keyword: str, condition: dict[str, Any],
                            needs: list[str]) -> None:
        if not self.flow.steps[slug].get("needs"):
            tested = self.input_contract.schema if self.input_contract else None
            if tested is not None:
                reason = contracts.never_contains(tested, condition)
                if reason:
                    self._never_matches(("steps", slug, keyword), slug, keyword, "the run input",
                                        reason)
            return
        for need, pattern in condition.items():
            tested = self.seen_as(need) if need in needs else None
            if tested is None:
                continue
            reason = contracts.never_contains(tested, pattern)
            if reason:
                self._never_matches(("steps", slug, keyword, need), slug, keyword,
                                    f"the output of `{need}`", reason)

    def _never_matches(self, path: tuple[str | int, ...], slug: str, keyword: str, what: str,
                       reason: str) -> None:
        outcome = "be met" if keyword == "if" else "hold"
        self.flow.error(path, codes.CONDITION_NEVER_MATCHES,
                        f"`{keyword}` of step `{slug}` can never {outcome}: by its schema, in {what} "
                        f"{reason}",
                        "correct the condition, or the schema if the data can look like this")
