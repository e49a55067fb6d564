"""dslc's Python API (docs/language.md §15): load a .bend program, call its functions on NumPy
arrays, differentiate them, read their gradient programs.

The names below are imported on first use, so that `import dsl` is quick and dslc's start-up,
which answers Ctrl-C itself (dsl/cli.py), does not spend its first second here."""
import importlib
import sys
import types

_HOMES = {"DslError": "frontend.diagnostics", "Key": "dsl.values", "Program": "dsl.program", "Record": "dsl.values",
          "key": "dsl.values", "load": "dsl.program", "loads": "dsl.program", "train": "dsl.train"}

__all__ = list(_HOMES)


class _Package(types.ModuleType):
    def __getattr__(self, name: str):
        if name in ("inputs", "program", "safetensors", "values"):   # as when they were imported eagerly
            return importlib.import_module(f"dsl.{name}")
        if name not in _HOMES:
            raise AttributeError(f"module 'dsl' has no attribute {name!r}")
        value = getattr(importlib.import_module(_HOMES[name]), name)
        setattr(self, name, value)
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_HOMES))

    def __setattr__(self, name: str, value) -> None:
        # importing the submodule dsl/train.py sets dsl.train to it; dsl.train is the function
        if name == "train" and isinstance(value, types.ModuleType):
            value = value.train
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
