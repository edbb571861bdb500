"""The wave planner: from a MetaGraph and a cost model to a placed, timed wave plan.

``make_plan`` (``search.make``) plans one mix, ``plan_schedule`` (``search.phases``) every phase
of a schedule of mixes. ``make_plan`` reads top to bottom; the sub-packages each decide one thing:
``model`` what is planned (MetaOps' curves, levers, the passes' switches), ``starts`` the
schedules the search begins from (the paper's waves, the baselines, other layouts),
``improve`` how a schedule gets better (re-split, rebalance, polish), ``evaluate`` what a
schedule costs once placed (placement, ledger, timing, device renamings, loss spreading),
``bound`` what no plan can beat, ``solver`` the MILP/LP solver and its isolation, and
``search`` the lever search and rounds that tie them together. ``docs/planner.md`` walks the
loop.
"""

from spindle_dsl.planner.search.make import DEFAULT_TIME_LIMIT_S, SCHEDULERS, make_plan
from spindle_dsl.planner.search.phases import plan_schedule

__all__ = ["DEFAULT_TIME_LIMIT_S", "SCHEDULERS", "make_plan", "plan_schedule"]
