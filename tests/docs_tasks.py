"""The handler behind the documentation's requests (docs/client.md, docs/cli.md): a pool of
`phpmq workers docs_tasks:answer` answers them while those documents are tested
(tests/docs_examples.py, `start_workers`)."""

from __future__ import annotations

from typing import Any

from phpmq.workers import ReceivedMessage

PRICES = {"SKU-9": {"eur": 9.5}}


def answer(message: ReceivedMessage) -> Any:
    """`prices`: the price of the SKU in the content (an unknown one raises KeyError, an error
    reply); any other queue (`resize`): b"ok"."""
    if message.queue == "prices":
        return PRICES[message.content.decode()]
    return b"ok"
