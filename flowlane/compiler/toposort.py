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


MAX_CYCLES = 20  # cycles reported at most: a dense tangle has more than anyone reads


def find_cycles(declared: Sequence[str], needs: Mapping[str, Sequence[str]],
                placed: set[str], limit: int = MAX_CYCLES) -> list[list[str]]:
    """Every elementary cycle among the unplaced steps, each once as ``[a, b, ..., a]``
    where each step needs the previous one, starting from its earliest-declared step;
    ordered by that step, at most ``limit`` of them (Johnson's algorithm: the time grows with
    the cycles found, not with the paths tried)."""
    remaining = [s for s in declared if s not in placed]
    position = {slug: i for i, slug in enumerate(remaining)}
    needed_by: dict[str, list[str]] = {s: [] for s in remaining}
    for slug in remaining:
        for need in dict.fromkeys(needs.get(slug, ())):
            if need in position:
                needed_by[need].append(slug)
    found: list[list[str]] = []
    for start in remaining:
        if len(found) >= limit:
            break
        group = _strongly_connected(start, needed_by, position)
        if group:
            found += _cycles_through(start, {s: [c for c in needed_by[s] if c in group]
                                             for s in group}, limit - len(found))
    return found


def _strongly_connected(start: str, edges: Mapping[str, Sequence[str]],
                        position: Mapping[str, int]) -> set[str]:
    """The steps declared no earlier than ``start`` that are on a cycle with it."""
    later = {s for s in edges if position[s] >= position[start]}
    forward = _reachable(start, edges, later)
    backward_edges: dict[str, list[str]] = {s: [] for s in later}
    for slug in later:
        for child in edges[slug]:
            if child in later:
                backward_edges[child].append(slug)
    return forward & _reachable(start, backward_edges, later) if start in forward else set()


def ancestors(step: str, needs: Mapping[str, Sequence[str]]) -> set[str]:
    """The steps ``step`` depends on, directly or through other steps."""
    return _reachable(step, needs, set(needs))


def _reachable(start: str, edges: Mapping[str, Sequence[str]], allowed: set[str]) -> set[str]:
    """Steps reached from ``start`` by one edge or more."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in edges[todo.pop()]:
            if child in allowed and child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _cycles_through(start: str, edges: Mapping[str, Sequence[str]], limit: int) -> list[list[str]]:
    """The elementary cycles through ``start`` within its strongly connected group."""
    found: list[list[str]] = []
    blocked = {start}
    blockers: dict[str, set[str]] = {s: set() for s in edges}
    path = [start]
    closes = [False]  # per step on the path: some cycle was found through it
    stack = [iter(edges[start])]
    while stack and len(found) < limit:
        child = next(stack[-1], None)
        if child == start:
            found.append([*path, start])
            closes[-1] = True
        elif child is not None and child not in blocked:
            path.append(child)
            closes.append(False)
            stack.append(iter(edges[child]))
            blocked.add(child)
        elif child is None:
            stack.pop()
            step, closed = path.pop(), closes.pop()
            if closed:
                _unblock(step, blocked, blockers)
                if closes:
                    closes[-1] = True
            else:
                for next_step in edges[step]:
                    blockers[next_step].add(step)
    return found


def _unblock(step: str, blocked: set[str], blockers: dict[str, set[str]]) -> None:
    todo = [step]
    while todo:
        current = todo.pop()
        if current in blocked:
            blocked.discard(current)
            todo.extend(blockers[current])
            blockers[current].clear()
