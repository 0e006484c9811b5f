"""Tiny handlers referenced by the example flows as ``examples.handlers.<module>:<callable>``."""
