"""Spindle-DSL: declare multi-task multi-modal training jobs, plan them with wavefront
scheduling (Spindle, arXiv 2409.03365), and run the plan on torch.distributed.

Importing the package is cheap: stages import what they need (lark, mip, torch) lazily.
"""

from spindle_dsl._checkout import map_checkout_folders

__version__ = "0.1.0"

map_checkout_folders()
