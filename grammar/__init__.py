"""The `.spindle` grammar, shipped as package data (see ``spindle_dsl.language``)."""
