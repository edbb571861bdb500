"""What is planned: MetaOps with their time curves and dependencies (``problem``), the memory
levers and the problem they give (``levers``), the continuous level optimum (``allocator``),
and the switches that turn the scheduler's passes off for measurement (``passes``)."""
