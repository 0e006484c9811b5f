"""Flow and alias slugs: one namespace for the project."""

from __future__ import annotations

from flowlane.compiler import codes, names
from flowlane.compiler.checks.shared import Analysis, Entry


def namespace(flows: list[Entry], aliases: list[Entry], state: Analysis) -> None:
    """Flow and alias slugs share one case-insensitive namespace; an alias may adopt the
    name of a flow it lists (``names.alias_may_take_flow_name``)."""
    first: dict[str, Entry] = {}
    for entry in [*flows, *aliases]:  # flows first: a clash of kinds meets the flow as `other`
        folded = entry.slug.lower()
        other = first.get(folded)
        if other is None or _adopts(entry, other):
            first[folded] = entry
            if entry.data["kind"] == "flow":
                state.flow_entries[entry.slug] = entry
                state.known_flows.add(entry.slug)
            else:
                state.known_aliases.add(entry.slug)
            continue
        where = other.loc()
        both = {entry.data["kind"], other.data["kind"]}
        code = codes.ALIAS_TAKES_FLOW_SLUG if both == {"flow", "alias"} else codes.DUPLICATE_SLUG
        help = "flow and alias slugs share one namespace (case-insensitive); rename one of them"
        if both == {"flow", "alias"}:
            help = (f"an alias may take the name of a flow only when it lists that flow, "
                    f"spelled the same, as its active or draining version: to give `{other.slug}` "
                    f"a new version without renaming its callers, add a flow `{other.slug}_v2` "
                    f"and an alias `{other.slug}` with `active: {other.slug}_v2` and "
                    f"`draining: [{other.slug}]` (README, \"Versions behind an alias from the "
                    "start\"); otherwise rename the alias")
        if entry.data["kind"] == "flow" == other.data["kind"]:
            limit = names.version_slug_limit(other.data.get("queues", "flow"))
            suggestion = names.next_version_slug(other.slug, max_length=limit)
            help += f" (a new flow version gets a new slug such as `{suggestion}`)"
        state.findings.append(entry.doc.diagnostic(
            ("slug",), code,
            f"{entry.data['kind']} slug `{entry.slug}` is already used by "
            f"{other.data['kind']} `{other.slug}` at {where}", help))


def _adopts(entry: Entry, other: Entry) -> bool:
    """``entry`` is an alias taking the name of the flow ``other`` that it lists."""
    if entry.data["kind"] != "alias" or other.data["kind"] != "flow":
        return False
    versions = [entry.data.get("active"), *entry.data.get("draining", [])]
    return names.alias_may_take_flow_name(entry.slug, other.slug, versions)
