"""The MILP/LP solver: which one runs (``choice``: HiGHS or CBC) and the worker process that
isolates its native code, so that a crash costs one solve, not the plan (``isolate``)."""
