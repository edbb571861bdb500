"""Package layout: the only thing pyproject.toml cannot say on its own.

The grammar and the backends live at the top level of the repository (the design card's layout)
but install inside the package as ``spindle_dsl.grammar`` and ``spindle_dsl.backends``, so the
project claims no generic top-level import name. Subpackages are found here so that adding one
needs no edit.
"""

from setuptools import find_packages, setup

PACKAGE_DIR = {
    "spindle_dsl": "spindle_dsl",
    "spindle_dsl.grammar": "grammar",
    "spindle_dsl.backends": "backends",
}


def _packages() -> list[str]:
    found = ["spindle_dsl", "spindle_dsl.grammar", "spindle_dsl.backends"]
    found += [f"spindle_dsl.{name}" for name in find_packages("spindle_dsl")]
    found += [f"spindle_dsl.backends.{name}" for name in find_packages("backends")]
    return found


setup(packages=_packages(), package_dir=PACKAGE_DIR)
