"""What no plan can beat: the LP relaxation (``lp_bound``), and the bounds that need no solver
(``floors``: the area and critical-path bound, and the floors of the step terms the LP does
not count)."""
