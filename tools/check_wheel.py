"""Check a compiled wheel (`make wheel`): it holds the compiled modules and their stamps, and
installed on its own it runs them. Usage: python tools/check_wheel.py dist/phpmq_zmq-*.whl"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile

#: What setup.py compiles: 2 codec modules and 11 of the core.
COMPILED_COUNT = 13
#: Run in the installed wheel alone: the hot path it reports, and where the core came from.
PROBE = (
    "import phpmq.broker.core as core; from phpmq.broker.build import hot_path;"
    " print(hot_path()); print(core.__file__)"
)


def main(wheel: str) -> int:
    names = zipfile.ZipFile(wheel).namelist()
    extensions = [n for n in names if n.endswith(".so") and "_compiled__mypyc" not in n]
    stamps = [n for n in names if n.endswith("_compiled_sources.txt")]
    if len(extensions) != COMPILED_COUNT or len(stamps) != 2:
        print(f"{wheel}: {len(extensions)} compiled modules, {len(stamps)} stamps", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as target:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target,
             wheel],
            check=True,
        )  # fmt: skip
        ran = subprocess.run(
            [sys.executable, "-c", PROBE],
            cwd=target,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": target, "PATH": "/usr/bin:/bin"},
        )
        expected = f"compiled ({COMPILED_COUNT} modules)"
        said = [*ran.stdout.split("\n"), "", ""]
        if said[0] != expected or not said[1].startswith(f"{target}/phpmq/broker/core.cpython"):
            print(f"{wheel} installed says {ran.stdout!r} {ran.stderr}", file=sys.stderr)
            return 1
    print(f"{wheel}: {expected}, stamped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
