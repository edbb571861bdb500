"""What no plan can beat: the area and critical-path bound (``area``), the LP relaxation
(``lp_bound``) and the floors of the step terms it does not count (``step_floor``)."""
