"""Stable topological order (each step after its needs, ties in declaration order) and cycle extraction."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def stable_order(declared: Sequence[str], needs: Mapping[str, Sequence[str]]) -> list[str]:
    """Repeatedly take the earliest-declared step whose needs are all placed.

    Needs naming unknown steps are ignored here (reported elsewhere). Steps on or
    behind a cycle are left out; compare the length with ``declared``.
    """
    position = {slug: i for i, slug in enumerate(declared)}
    waiting = {s: len({n for n in needs.get(s, ()) if n in position}) for s in declared}
    children: dict[str, list[str]] = {s: [] for s in declared}
    for slug in declared:
        for need in set(needs.get(slug, ())):
            if need in position:
                children[need].append(slug)
    ready = [position[s] for s in declared if waiting[s] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        slug = declared[heapq.heappop(ready)]
        order.append(slug)
        for child in children[slug]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, position[child])
    return order


def find_cycle(declared: Sequence[str], needs: Mapping[str, Sequence[str]],
               placed: set[str]) -> list[str]:
    """One cycle among the unplaced steps, as ``[a, b, ..., a]`` where each needs the previous."""
    remaining = [s for s in declared if s not in placed]
    known = set(remaining)
    start = remaining[0]
    # follow "needs" edges backwards from a remaining step until a step repeats
    path: list[str] = []
    seen: dict[str, int] = {}
    current = start
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(n for n in needs[current] if n in known)
    cycle_back = path[seen[current]:]  # each element needs the next one
    cycle = list(reversed(cycle_back))  # each element is needed by the next one
    return [*cycle, cycle[0]]
