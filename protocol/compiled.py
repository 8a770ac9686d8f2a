"""Which of a package's modules run compiled (setup.py, PHPMQ_COMPILE=1), and a check that each
was compiled from the source beside it.

A compiled module sits beside its source and wins the import. Built in a work tree and left
there, it would go on running the old code after the source changed: the build writes
STAMP_NAME (each compiled module's source hash) and a package with compiled modules refuses
to import when a source no longer matches, saying how to build again or go back to pure
Python. Imports only the standard library (this is the sans-IO package)."""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES

#: What the build writes beside the compiled modules: `<module file> <sha256 of it>` a line.
STAMP_NAME = "_compiled_sources.txt"
#: mypyc's shared library of a group (setup.py names each `<package>._compiled`).
_SHARED_LIBRARY = "_compiled__mypyc"


class StaleCompiledModule(ImportError):
    """A compiled module was built from another version of its source."""


def compiled_in(folder: str) -> list[str]:
    """The names of the modules in `folder` that are compiled (their sources beside them),
    sorted; [] for a pure-Python package."""
    names = []
    for entry in os.listdir(folder):
        for suffix in EXTENSION_SUFFIXES:
            if entry.endswith(suffix):
                name = entry[: -len(suffix)]
                if name != _SHARED_LIBRARY:
                    names.append(name)
                break
    return sorted(names)


def check_compiled(folder: str, package: str) -> None:
    """Refuse a package in `folder` whose compiled modules do not match their sources.

    Raises:
        StaleCompiledModule: a compiled module's source changed since the build, or the
            build's stamp is missing.
    """
    names = compiled_in(folder)
    if not names:
        return
    stamped = _read_stamp(os.path.join(folder, STAMP_NAME))
    for name in names:
        source = os.path.join(folder, name + ".py")
        if not os.path.exists(source):
            continue  # shipped compiled only: nothing to compare with
        if stamped.get(name + ".py") != source_hash(source):
            raise StaleCompiledModule(
                f"{package}.{name} is compiled from another version of {source}: run"
                " `make compiled` to compile it again, or `make pure` to remove the compiled"
                " modules"
            )


def source_hash(path: str) -> str:
    """The hash the build stamps a compiled module's source with."""
    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def _read_stamp(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as stamp:
            return dict(line.split() for line in stamp if line.strip())
    except (OSError, ValueError):
        return {}


check_compiled(os.path.dirname(__file__), __package__ or "phpmq.protocol")
