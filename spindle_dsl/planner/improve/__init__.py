"""Making a schedule better: layers re-split between its pieces (``resplit``), each wave's
allocations rebalanced (``crosslevel``), and local search on the placed plan (``polish``)."""
