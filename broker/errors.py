"""The refusal of an operator command (broker/admin.py), for the parts that run one."""

from __future__ import annotations

from ..protocol import ErrorCode


class CommandError(ValueError):
    """A command cannot be done; `code` is the ADMIN_REPLY error code (422 unless said)."""

    def __init__(self, reason: str, code: int = ErrorCode.INVALID_VALUE) -> None:
        super().__init__(reason)
        self.code = int(code)
