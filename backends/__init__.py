"""Execution backends, installed as ``spindle_dsl.backends``.

A backend takes a validated plan and the MetaGraph it was made for and runs it; the one here is
the PyTorch backend on torch.distributed (``spindle_dsl.backends.torch``).
"""
