"""Free device ids handed out node first: the fallback both device renamings share.

Why. Where a renaming (``planner.evaluate.cutmatch``) or a spread loss group's order
(``planner.evaluate.lossspread.shard_order``) has no device that holds a piece's rows, the next best
is a device of the same node (a link inside a node is ~12x faster than across), else any:
the first free one in the order given, so that the choice is deterministic. Searching a list
for each request would make the renaming quadratic in the devices; the pool answers each in
amortised constant time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class NodePool:
    """Device ``ids`` not yet taken, in the order given; ``per_node`` devices to a node."""

    def __init__(self, ids: Iterable[int], per_node: int) -> None:
        self._order = deque(ids)
        self._left = set(self._order)
        self._by_node: dict[int, deque[int]] = {}
        for d in self._order:
            self._by_node.setdefault(d // per_node, deque()).append(d)

    def take(self, node: int) -> int:
        """The first free id of ``node``, else the first free id (one must be left)."""
        near = self._by_node.get(node)
        while near and near[0] not in self._left:
            near.popleft()
        pool = near if near else self._order
        while pool[0] not in self._left:
            pool.popleft()
        d = pool.popleft()
        self._left.discard(d)
        return d
