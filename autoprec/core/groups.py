"""Connected groups: which items a set of links joins (union-find), for graph rewrites that treat a
run of joined nodes as one (a decomposed LayerNorm as one unit, neutral ops as one region member)."""

from __future__ import annotations

from typing import Iterable, Sequence, TypeVar

T = TypeVar("T")


def connected(items: Sequence[T], links: Iterable[tuple[T, T]]) -> list[list[T]]:
    """``items`` grouped by ``links`` (pairs of items, by identity): each group in the items' order, the
    groups in the order of their first item."""
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
