"""Coverage-guided fuzzing of the PHPMQ decoders with atheris (not a pytest module).

Any exception other than a ProtocolError out of decode_message, any exception at all out of
decode_frame, and anything but a RemoteProtocolError out of StreamDecoder is a crash. So is a
frame accepted whole that does not survive re-encoding.

    .venv/bin/pip install atheris
    .venv/bin/python tests/fuzz_decoder.py -max_total_time=60 [CORPUS_DIR ...]
    .venv/bin/python tests/fuzz_decoder.py --write-seeds CORPUS_DIR   # seed a corpus first
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from phpmq.protocol import (
        Ack,
        Admin,
        Consume,
        DeadLetter,
        Disconnect,
        Dispatch,
        Error,
        Heartbeat,
        Hello,
        ProtocolError,
        RemoteProtocolError,
        Requeue,
        Send,
        StreamDecoder,
        TruncatedError,
        decode_frame,
        decode_message,
        encode,
        encode_all,
    )

#: Small enough that a fuzzed length field is refused early, big enough for any input.
MAX_CONTENT = 1 << 20

SEEDS = [
    Send("Foo", b"Hello World", 0),
    Send("Unit-Test-Queue", b"Unit-Test"),
    Consume("Foo", 5),
    Dispatch("Foo", b"Hello World", "d7e7f68761d34838494b233148b5486c", 3300, 2),
    Dispatch("Unit-Test-Queue", b"Hello World", "Unit-Test-ID"),
    Ack("Unit-Test-Queue", "Unit-Test-ID"),
    Requeue("Foo", "d7e7f68761d34838494b233148b5486c", 3600),
    DeadLetter("Foo", "d7e7f68761d34838494b233148b5486c", "poison"),
    Error(400, "bad", "id", "q"),
    Hello({"version": 1, "features": ["ttl", "delivery-count"], "nested": {"a": [1.5, None]}}),
    Heartbeat(),
    Disconnect("bye"),
    Admin({"command": "stats"}),
]


def _check_frame(data: bytes) -> None:
    messages, error = decode_frame(data, MAX_CONTENT)
    if error is not None:
        if not isinstance(error, RemoteProtocolError) or isinstance(error, TruncatedError):
            raise AssertionError(f"decode_frame returned {error!r}")
        return
    again = decode_frame(encode_all(messages), MAX_CONTENT)
    if again != (messages, None):
        raise AssertionError(f"re-encoding changed {messages!r} into {again!r}")


def _check_message(data: bytes) -> None:
    try:
        message, end = decode_message(data, 0, MAX_CONTENT)
    except TruncatedError as exc:
        if exc.needed <= len(data):
            raise AssertionError(f"truncated, yet needs only {exc.needed}") from exc
        return
    except ProtocolError:
        return
    if not 8 <= end <= len(data):
        raise AssertionError(f"end {end} outside the input")
    if decode_message(encode(message))[0] != message:
        raise AssertionError(f"{message!r} does not survive a round trip")


def _check_stream(data: bytes) -> None:
    # The first byte picks the chunk size, the rest is the stream.
    size = (data[0] if data else 0) + 1
    body = data[1:]
    decoder = StreamDecoder(MAX_CONTENT)
    try:
        for start in range(0, len(body), size):
            decoder.receive_data(body[start : start + size])
            while decoder.next_message() is not None:
                pass
        decoder.receive_data(b"")
        while decoder.next_message() is not None:
            pass
    except RemoteProtocolError:
        return
    if decoder.buffered:
        raise AssertionError(f"{decoder.buffered} bytes left at a clean end of stream")


def fuzz_one_input(data: bytes) -> None:
    _check_frame(data)
    _check_message(data)
    _check_stream(data)


def write_seeds(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, message in enumerate(SEEDS):
        (directory / f"seed-{index:02d}").write_bytes(encode(message))
    (directory / "seed-frame").write_bytes(encode_all(SEEDS))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-seeds":
        write_seeds(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, fuzz_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
