"""The search: ``make`` (``make_plan``) runs the lever search (``leversearch``, ``memfit``),
each lever setting a round of schedulers (``rounds``, ``milp_scheduler``), with helper
processes where cores are spare (``helpers``), and schedules of mixes (``phases``)."""
