"""Graph algorithms the rewrites need: connected groups (union-find: a decomposed LayerNorm as one
unit) and a minimum cut (which neutral ops an FP16 region takes in)."""

from __future__ import annotations

import math
from collections import deque
from typing import Hashable, Iterable, Mapping, Sequence, TypeVar

T = TypeVar("T")


def connected(items: Sequence[T], links: Iterable[tuple[T, T]]) -> list[list[T]]:
    """``items`` grouped by ``links`` (pairs of items, by identity): each group in the items' order,
    the groups in the order of their first item."""
    parent = {id(item): id(item) for item in items}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for a, b in links:
        parent[root(id(b))] = root(id(a))
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(root(id(item)), []).append(item)
    return list(groups.values())


def min_cut(capacity: Mapping[Hashable, Mapping[Hashable, float]], source: Hashable, sink: Hashable) -> set:
    """The source's side of a minimum source-sink cut of a directed network (``capacity[a][b]``: the
    edge a -> b; ``math.inf`` for one never cut): Edmonds-Karp, augmenting along shortest paths
    until none is left, then what the source still reaches. Ties go to the sink's side."""
    residual: dict = {}
    for a, edges in capacity.items():
        for b, c in edges.items():
            residual.setdefault(a, {})[b] = residual.get(a, {}).get(b, 0.0) + c
            residual.setdefault(b, {}).setdefault(a, 0.0)
    while True:
        parent = {source: None}
        queue = deque([source])
        while queue and sink not in parent:
            a = queue.popleft()
            for b, c in residual.get(a, {}).items():
                if c > 0 and b not in parent:
                    parent[b] = a
                    queue.append(b)
        if sink not in parent:
            return set(parent)
        path, node = [], sink
        while parent[node] is not None:
            path.append((parent[node], node))
            node = parent[node]
        flow = min(residual[a][b] for a, b in path)
        if math.isinf(flow):
            raise ValueError("min_cut: the source reaches the sink through edges never cut")
        for a, b in path:
            residual[a][b] -= flow
            residual[b][a] += flow
