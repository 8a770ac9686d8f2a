"""The build's one optional step: the compiled hot path (docs/performance.md).

With PHPMQ_COMPILE=1 (and mypy installed: `make compiled` does both), mypyc compiles the
modules of COMPILED into C extensions that sit beside their sources; without it, nothing here
runs and the package is pure Python, which is what `pip install` gives anywhere. Both pass
the same tests (`make test` runs the suite once each way).

mypy names a module after the packages around its file, and ours live in top-level folders
(broker/ installs as phpmq.broker): the sources are copied into build/mypyc-src/phpmq/ first,
so that the extensions get their installed names. Compiled modules left in the tree by an
earlier build are removed first, and only a build that succeeded stamps the sources it was
built from (protocol/compiled.py checks the stamp at import).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: The hot path of a message (intake, dispatch, acks) and the codec it reads and writes with;
#: each group is one shared library in its own package (protocol/ imports nothing of ours).
COMPILED = {
    "phpmq.protocol": ("protocol", ["runs.py", "writer.py"]),
    "phpmq.broker": (
        "broker",
        [
            "context.py",
            "core.py",
            "deadlines.py",
            "dispatch.py",
            "expiry.py",
            "flow.py",
            "idempotency.py",
            "intake.py",
            "journal.py",
            "peers.py",
            "queues.py",
        ],
    ),
}
STAGE = Path("build", "mypyc-src")
#: protocol/compiled.py's STAMP_NAME.
STAMP_NAME = "_compiled_sources.txt"
NO_MYPYC = (
    "PHPMQ_COMPILE=1 needs mypyc in the build environment: pip install -e '.[compile]', then"
    " build with --no-build-isolation (`make compiled` does both; docs/performance.md)"
)


class BuildAndStamp(build_ext):
    """build_ext that first removes an earlier in-place build (a build that fails then leaves
    the tree pure, never old modules beside new sources) and, once it succeeded, writes the
    stamp of the sources it compiled beside the modules (in place, or in the wheel's tree)."""

    def run(self) -> None:
        if not self.extensions:  # the pure build
            super().run()
            return
        if self.inplace:
            _remove_earlier_build()
        super().run()
        for package, (folder, _) in COMPILED.items():
            target = Path(folder) if self.inplace else Path(self.build_lib, *package.split("."))
            target.mkdir(parents=True, exist_ok=True)
            (target / STAMP_NAME).write_text(_stamps[package], encoding="utf-8")


#: Each compiled package's stamp, made from the copies mypyc compiled (an edit saved while
#: the build runs is not stamped as built).
_stamps: dict[str, str] = {}


def _stamp(folder: Path) -> str:
    """`<file> <sha256>` for every source in `folder`, as protocol/compiled.py reads it."""
    sources = sorted(folder.glob("*.py"))
    return "".join(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in sources)


def _remove_earlier_build() -> None:
    """The compiled modules (of COMPILED, and each group's shared library) and the stamps an
    earlier in-place build left in the tree."""
    for folder, files in COMPILED.values():
        ours = {name.removesuffix(".py") for name in files} | {"_compiled__mypyc"}
        for path in Path(folder).iterdir():
            compiled = path.suffix == ".so" and path.name.split(".")[0] in ours
            if (compiled or path.name == STAMP_NAME) and not path.is_dir():
                path.unlink()


def _staged() -> list[tuple[list[str], str]]:
    """Copy the packages mypy reads into STAGE; each group's staged files and its name."""
    shutil.rmtree(STAGE, ignore_errors=True)
    shutil.copytree("phpmq", STAGE / "phpmq", ignore=shutil.ignore_patterns("__pycache__"))
    groups = []
    for package, (folder, files) in COMPILED.items():
        target = STAGE / package.replace(".", "/")
        shutil.copytree(
            folder, target, ignore=shutil.ignore_patterns("__pycache__", "*.so", STAMP_NAME)
        )
        groups.append(([str(target / name) for name in files], f"{package}._compiled"))
        _stamps[package] = _stamp(target)
    return groups


def _extensions() -> list:
    if os.environ.get("PHPMQ_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit(NO_MYPYC)
    if {"--inplace", "-i"} & set(sys.argv):  # before mypyc, which exits on a type error
        _remove_earlier_build()
    groups = _staged()
    paths = [path for files, _ in groups for path in files]
    return mypycify(
        ["--ignore-missing-imports", "--follow-imports=silent", *paths],
        opt_level="3",
        separate=groups,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildAndStamp})
