"""Logging for the pool and its workers: plain lines, or one JSON object per line (--json)."""

from __future__ import annotations

import logging
import sys
import time

import msgspec

_json = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "process": self.process_name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _json.encode(entry).decode()


def configure_logging(as_json: bool, process_name: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(JsonFormatter(process_name))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {process_name}: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
