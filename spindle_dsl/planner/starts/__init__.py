"""Schedules the search starts from: the paper's wavefront and the levels packed on shared
devices (``wavefront``), the baselines (``baselines``), CPA list scheduling (``listsched``),
tasks side by side and the critical chain's head first (``taskpar``); ``minmax`` gives the
min-max allocations they share."""
