"""Whether this broker runs its hot path compiled (setup.py, PHPMQ_COMPILE=1) or as pure
Python: the start-up log and `phpmq bench` say which."""

from __future__ import annotations

import os

from .. import protocol
from ..protocol.compiled import compiled_in


def compiled_modules() -> list[str]:
    """The codec's and the core's compiled modules, by their import names."""
    packages = ((protocol.__name__, protocol.__file__), (__package__, __file__))
    return [
        f"{package}.{name}"
        for package, path in packages
        for name in compiled_in(os.path.dirname(str(path)))
    ]


def hot_path() -> str:
    """'compiled (N modules)' or 'pure Python'."""
    names = compiled_modules()
    return f"compiled ({len(names)} modules)" if names else "pure Python"
