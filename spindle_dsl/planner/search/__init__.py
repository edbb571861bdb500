"""The search: ``make`` (``make_plan``) runs the lever search (``leversearch``, ``memfit``,
``offered``), each lever setting a round of schedulers (``rounds``, ``milp_scheduler``), in
helper processes where cores are spare (``helpers``), and schedules of mixes
(``phases``)."""
