"""What some examples need beyond dslc: the packages of the `examples` extra, imported with a
message that says how to install them."""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, package: str) -> ModuleType:
    """`import module`, or an ImportError that names the PyPI package giving it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"this example needs the PyPI package '{package}': pip install "
                          f"'dslc[examples]' (or pip install {package})") from None
