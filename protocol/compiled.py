"""Which of a package's modules run compiled (setup.py, PHPMQ_COMPILE=1), and a check that they
were compiled from the sources beside them.

A compiled module sits beside its source and wins the import. Built in a work tree and left
there, it would go on running the old code after a source changed, and mypyc builds into it
the types of every module it reads, not only its own. So a successful build stamps every
source of the package (STAMP_NAME: `<file> <sha256>` a line), and a package with compiled
modules refuses to import when a stamped source changed, a compiled module has no source or
no stamp, saying how to build again or go back to pure Python. Imports only the standard
library (this is the sans-IO package)."""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES

#: What a build writes beside the compiled modules: `<source file> <sha256 of it>` a line.
STAMP_NAME = "_compiled_sources.txt"
#: mypyc's shared library of a group (setup.py names each `<package>._compiled`).
_SHARED_LIBRARY = "_compiled__mypyc"


class StaleCompiledModule(RuntimeError):
    """A package's compiled modules were built from other sources than those beside them.
    (Not an ImportError: code that reads "cannot import" as "not installed" must not hide
    it; the CLI prints it as one line.)"""


def compiled_in(folder: str) -> list[str]:
    """The names of the modules in `folder` compiled for this interpreter, sorted; [] for a
    pure-Python package. (Another interpreter's build, `x.cpython-312-....so`, is not one.)"""
    names = []
    for entry in os.listdir(folder):
        for suffix in EXTENSION_SUFFIXES:
            if entry.endswith(suffix):
                name = entry[: -len(suffix)]
                if "." not in name and name != _SHARED_LIBRARY:
                    names.append(name)
                break
    return sorted(names)


def check_compiled(folder: str, package: str) -> None:
    """Refuse a package in `folder` whose compiled modules do not match their sources.

    Raises:
        StaleCompiledModule: a stamped source changed since the build, a compiled module has
            no source beside it or none in the stamp, or the stamp is missing.
    """
    names = compiled_in(folder)
    if not names:
        return
    stamped = _read_stamp(os.path.join(folder, STAMP_NAME))
    if not stamped:
        raise _stale(package, os.path.join(folder, STAMP_NAME), "is missing or unreadable")
    for name in names:
        if name + ".py" not in stamped or not os.path.exists(os.path.join(folder, name + ".py")):
            raise _stale(
                package, os.path.join(folder, name + ".py"), "has no source it was built from"
            )
    for source, digest in stamped.items():
        path = os.path.join(folder, source)
        if not os.path.exists(path) or source_hash(path) != digest:
            raise _stale(package, path, "changed since the build")


def _stale(package: str, path: str, what: str) -> StaleCompiledModule:
    return StaleCompiledModule(
        f"{package} is compiled, and {path} {what}: run `make compiled` to compile it again,"
        " or `make pure` to remove the compiled modules"
    )


def source_hash(path: str) -> str:
    """The hash the build stamps a source with."""
    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def _read_stamp(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as stamp:
            return dict(line.split() for line in stamp if line.strip())
    except (OSError, ValueError):
        return {}


check_compiled(os.path.dirname(__file__), __package__ or "phpmq.protocol")
