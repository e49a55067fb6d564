"""dslc's Python API (LANGUAGE.md §12)."""
from frontend.diagnostics import DslError

__all__ = ["DslError"]
