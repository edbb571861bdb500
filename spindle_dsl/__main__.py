"""``python -m spindle_dsl`` is the ``spindle`` command (torchrun launches it this way)."""

import sys

from spindle_dsl.cli import main

sys.exit(main())
