"""Making a schedule better: layers re-split between its pieces (``resplit``), one MILP over
all waves (``wave_milp``), and local search on the placed plan with each wave's allocations
rebalanced (``polish``)."""
