"""Making a schedule better: layers re-split between its pieces (``resplit``), each wave's
allocations rebalanced (``crosslevel``), one MILP over all waves (``wave_milp``), and local
search on the placed plan (``polish``)."""
