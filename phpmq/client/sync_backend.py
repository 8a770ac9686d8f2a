"""What the blocking client does its own way, for the modules written once (tools/unasync.py);
aio_backend.py is the asyncio twin."""

from __future__ import annotations

#: How long one wait for the broker blocks at most before looking again: the waiting thread
#: lets go of the socket this often, so the heartbeat thread keeps its turn.
WAIT_SLICE_S = 0.05
