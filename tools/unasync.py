"""Write the blocking client's driver modules from the asyncio ones (docs/architecture.md,
"The client"): `phpmq/client/aio_X.py` is the source, `phpmq/client/sync_X.py` its output.

The rewrite is by whole words, line by line (httpcore's unasync approach): `async`/`await` go,
asyncio names become their blocking twins. What differs for real (locking, the socket, the
background work, waiting) lives in the hand-written aio_backend.py and sync_backend.py,
imported under one name (`backend`).

    python tools/unasync.py           write the sync modules
    python tools/unasync.py --check   exit 1 if one differs from what would be written
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parent.parent / "phpmq" / "client"

#: The asyncio modules that are a source, and the blocking module written from each.
PAIRS = {
    "aio.py": "sync.py",
    "aio_admin.py": "sync_admin.py",
    "aio_batches.py": "sync_batches.py",
    "aio_requests.py": "sync_requests.py",
    "aio_shards.py": "sync_shards.py",
    "aio_topics.py": "sync_topics.py",
}

#: Whole words replaced, in this order (a word is letters, digits and `_`).
WORDS = {
    "async def": "def",
    "async with": "with",
    "async for": "for",
    "AsyncClient": "Client",
    "AsyncReceivedMessage": "ReceivedMessage",
    "to_owner_async": "to_owner",
    "aio.py": "sync.py",
    "asyncio client": "blocking client",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "AsyncIterator": "Iterator",
}
#: Other names that begin with `Async` are the mixins: `AsyncTopics` becomes `SyncTopics`.
MIXIN = re.compile(r"\bAsync(?=[A-Z])")
#: A client module's name: `aio_topics` becomes `sync_topics`, `aio_backend` `sync_backend`.
MODULE = re.compile(r"\baio_(?=[a-z])")
#: `await ` followed by its operand; the space goes with the keyword.
AWAIT = re.compile(r"\bawait ")


def _word_pattern(word: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])" + re.escape(word) + r"(?!\w)")


REWRITES = [(_word_pattern(old), new) for old, new in WORDS.items()]


def unasync_line(line: str) -> str:
    """The blocking twin of one line of an asyncio source."""
    line = AWAIT.sub("", line)
    for pattern, new in REWRITES:
        line = pattern.sub(new, line)
    return MODULE.sub("sync_", MIXIN.sub("Sync", line))


#: The first line of a source, which its output replaces with its own.
SOURCE_MARK = "# The source of "


def unasync(source: str, source_name: str) -> str:
    """The whole blocking module: a first line that says where it came from, then the
    rewritten source (less its own first line, the one that names its output)."""
    header = f"# auto-generated from {source_name} by tools/unasync.py; do not edit.\n"
    lines = source.splitlines(keepends=True)
    if lines and lines[0].startswith(SOURCE_MARK):
        lines = lines[1:]
    return header + "".join(unasync_line(line) for line in lines)


def outputs() -> dict[Path, str]:
    """Every generated module's path and the text it should have."""
    return {
        CLIENT / target: unasync((CLIENT / source).read_text(), source)
        for source, target in PAIRS.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    check = parser.parse_args(argv).check
    stale = []
    for path, text in outputs().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not check:
            path.write_text(text)
    if check and stale:
        for path in stale:
            print(f"unasync: {path.name} differs from its source; run tools/unasync.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
