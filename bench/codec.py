"""Micro-benchmark of the PHPMQ codec: encode + decode per message, by type."""

from __future__ import annotations

import timeit

from rich.console import Console
from rich.table import Table

from .. import protocol as p

MESSAGE_ID = b"d7e7f68761d34838494b233148b5486c"


def run_codec_benchmark(size: int = 100, batch: int = 100, rounds: int = 200) -> dict[str, float]:
    content = b"x" * size
    packet = p.queue_packet("bench")
    cases = {
        "001 send": (lambda: p.encode_send(packet, content, 0)),
        "003 dispatch": (lambda: p.encode_dispatch(packet, content, MESSAGE_ID, 3600, 1)),
        "004 ack": (lambda: p.encode_ack(packet, MESSAGE_ID)),
    }
    table = Table(title=f"codec: {size}-byte content, {batch} messages per frame")
    for column in ("message", "encode µs", "decode µs", "encode+decode µs", "msgs/s"):
        table.add_column(column, justify="right")
    results = {}
    for name, make in cases.items():
        encode_s = timeit.timeit(make, number=batch * rounds) / (batch * rounds)
        frame = make() * batch
        decode_s = timeit.timeit(lambda f=frame: p.decode_frame(f), number=rounds) / (
            batch * rounds
        )
        total = encode_s + decode_s
        results[name] = total
        table.add_row(
            name,
            f"{encode_s * 1e6:.2f}",
            f"{decode_s * 1e6:.2f}",
            f"{total * 1e6:.2f}",
            f"{1 / total:,.0f}",
        )
    Console().print(table)
    return results


if __name__ == "__main__":
    run_codec_benchmark()
