"""dslc's Python API (LANGUAGE.md §12): load a .bend program, call its functions on NumPy
arrays, differentiate them, read their gradient programs."""
from dsl.program import Key, Program, Record, key, load, loads
from dsl.train import train
from frontend.diagnostics import DslError

__all__ = ["DslError", "Key", "Program", "Record", "key", "load", "loads", "train"]
