"""The free-device pool the renamings share (``planner.evaluate.placement``): a device of the node
asked for first, in the order given, else the first free one, each id once."""

from __future__ import annotations

from spindle_dsl.planner.evaluate.placement import NodePool


def test_the_pool_hands_out_a_device_of_the_node_else_the_first_free_one_once_each():
    pool = NodePool([5, 1, 9, 12, 2], per_node=4)  # nodes 1, 0, 2, 3, 0
    assert pool.take(0) == 1  # node 0's first in the order given
    assert pool.take(0) == 2
    assert pool.take(0) == 5  # node 0 is out: the first free one
    assert pool.take(2) == 9
    assert pool.take(1) == 12  # node 1's only device went to node 0's request
