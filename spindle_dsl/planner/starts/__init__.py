"""Schedules the search starts from: the paper's wavefront (``wavefront``), the baselines
(``baselines``), CPA list scheduling (``listsched``), tasks side by side (``taskpar``), short
MetaOps packed on shared devices (``packing``) and the critical chain's head first
(``chainstart``); ``minmax`` gives min-max allocations they share."""
