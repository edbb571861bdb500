"""What is planned: MetaOps with their time curves, dependencies and each level's continuous
optimum (``problem``), and what one planning call may pull (``levers``: the memory levers and
the problem they give, the scheduler's passes and the call's time budget)."""
