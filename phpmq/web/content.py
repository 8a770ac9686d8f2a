"""A message's content as the console shows it: never as HTML. Text as text, a JSON object
or array pretty-printed, anything else (not UTF-8, or control characters) as hex with
offsets; at most `MAX_SHOWN_BYTES` of it. The templates escape what comes out of here."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass

MAX_SHOWN_BYTES = 16 * 1024
HEX_ROW_BYTES = 16
#: Characters below space a text may hold.
_TEXT_CONTROLS = frozenset("\n\r\t")


@dataclass(frozen=True)
class ShownContent:
    #: "text", "json" or "binary".
    kind: str
    text: str
    #: The content's whole size in bytes.
    size: int
    #: Only the first MAX_SHOWN_BYTES are shown.
    cut: bool


def shown(content: bytes) -> ShownContent:
    part = content[:MAX_SHOWN_BYTES]
    cut = len(content) > len(part)
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(part, final=not cut)
    except UnicodeDecodeError:
        return ShownContent("binary", hex_dump(part), len(content), cut)
    if any(char < " " and char not in _TEXT_CONTROLS for char in text):
        return ShownContent("binary", hex_dump(part), len(content), cut)
    if not cut and text.lstrip()[:1] in ("{", "["):
        try:
            value = json.loads(text)
        except ValueError:
            pass
        else:
            pretty = json.dumps(value, indent=2, ensure_ascii=False)
            return ShownContent("json", pretty, len(content), cut)
    return ShownContent("text", text, len(content), cut)


def hex_dump(data: bytes) -> str:
    """Rows of 16 bytes: the offset, the bytes in hex, and the printable ones as ASCII."""
    rows = []
    for offset in range(0, len(data), HEX_ROW_BYTES):
        row = data[offset : offset + HEX_ROW_BYTES]
        ascii_part = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        rows.append(f"{offset:08x}  {row.hex(' '):<{HEX_ROW_BYTES * 3 - 1}}  {ascii_part}")
    return "\n".join(rows)
