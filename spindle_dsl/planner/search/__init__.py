"""The search: ``make`` (``make_plan``) runs the lever search (``leversearch``, ``memfit``),
each lever setting a round of schedulers and the ``milp`` scheduler (``rounds``), with helper
processes where cores are spare (``helpers``), and schedules of mixes (``phases``)."""
