"""A key flooding a queue it may not send to costs next to nothing (issue #27, finding 10):
the sends like the first in its frame are refused with it, by their headers only, as one 403
with a count; a send to another queue in the same frame is still checked on its own."""

from __future__ import annotations

import pytest

import phpmq.protocol as p
from phpmq.broker import core as core_module
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.guard import Principal
from phpmq.broker.model import PeerProfile
from phpmq.broker.permissions import Permissions, Rights

ROUTER = PeerProfile("router", ttl_form=True)
LIMITED = Principal("limited", "10.0.0.1:1000", "router")


def test_a_frame_of_forbidden_sends_is_one_403_with_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = Core(BrokerConfig(), FakeClock())
    core.set_permissions(Permissions({"limited": Rights("limited", send=("jobs.*",))}))
    flood = p.encode_all([p.Send("billing", b"x" * 100, 0) for _ in range(256)])
    allowed = p.encode(p.Send("jobs.a", b"ok", 0))
    decoded: list[int] = []  # messages the core decoded, a count per turn

    def decode_frame(data: bytes, *rest: int) -> tuple[list[p.Message], object]:
        messages, error = p.decode_frame(data, *rest)
        decoded[-1] += len(messages)
        return messages, error

    monkeypatch.setattr(core_module, "decode_frame", decode_frame)
    out: list[p.Message] = []
    for turn in range(3):  # the first frame teaches the core to look for runs; the rest are runs
        decoded.append(0)
        core.begin_turn()
        hello = p.encode(p.Hello({})) if turn == 0 else b""
        core.handle_frame(b"f", hello + flood + allowed, ROUTER, LIMITED)
        for peer_id, frame in core.end_turn().frames:
            out += p.decode_frame(frame)[0] if peer_id == b"f" else []
    errors = [m for m in out if isinstance(m, p.Error)]
    assert [(e.code, e.count) for e in errors] == [(403, 256)] * 3
    assert core.guard.refused["send"] == 3 * 256
    assert core.queues["jobs.a"].ready_count == 3 and "billing" not in core.queues
    # The later frames were read as runs: the first send decoded, the rest of the run by its
    # headers only, and the send after it decoded.
    assert decoded == [1 + 256 + 1, 1, 1]
