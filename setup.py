"""The build's one optional step: the compiled hot path (docs/performance.md, "The compiled
hot path").

With PHPMQ_COMPILE=1 (and mypy installed: `make compiled` does both), mypyc compiles the
modules of COMPILED into C extensions that sit beside their sources; without it, nothing here
runs and the package is pure Python, which is what `pip install` gives anywhere. Both pass
the same tests (`make test` runs the suite once each way).

mypy names a module after the packages around its file, and ours live in top-level folders
(broker/ installs as phpmq.broker): the sources are copied into build/mypyc-src/phpmq/ first,
so that the extensions get their installed names.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from setuptools import setup

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


def _staged() -> list[tuple[list[str], str]]:
    """Copy the packages mypy reads into STAGE, and stamp each compiled module's source
    (protocol/compiled.py); each group's staged files and its name."""
    shutil.rmtree(STAGE, ignore_errors=True)
    shutil.copytree("phpmq", STAGE / "phpmq", ignore=shutil.ignore_patterns("__pycache__"))
    groups = []
    for package, (folder, files) in COMPILED.items():
        target = STAGE / package.replace(".", "/")
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        groups.append(([str(target / name) for name in files], f"{package}._compiled"))
        stamp = "".join(f"{name} {_sha256(Path(folder, name))}\n" for name in files)
        Path(folder, STAMP_NAME).write_text(stamp, encoding="utf-8")
    return groups


def _sha256(path: Path) -> str:
    """As protocol/compiled.py's source_hash (setup.py cannot import the package)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extensions() -> list:
    if os.environ.get("PHPMQ_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    groups = _staged()
    paths = [path for files, _ in groups for path in files]
    return mypycify(
        ["--ignore-missing-imports", "--follow-imports=silent", *paths],
        opt_level="3",
        separate=groups,
    )


setup(ext_modules=_extensions())
