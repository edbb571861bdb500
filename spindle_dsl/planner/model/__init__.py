"""What is planned: MetaOps with their time curves, dependencies and each level's continuous
optimum (``problem``), the memory levers and the problem they give (``levers``), and the
call's time budget and the switches that turn the scheduler's passes off for measurement
(``passes``)."""
