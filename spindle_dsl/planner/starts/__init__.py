"""Schedules the search starts from: the paper's wavefront and the levels packed on shared
devices (``wavefront``), the baselines (``baselines``), the starts that cross MetaLevels
(``crosslevel``: tasks side by side, the critical chain's head first, CPA list scheduling);
``layout`` holds what they share (spans cut into waves, min-max allocations)."""
