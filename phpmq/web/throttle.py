"""Failed logins, counted per client address: past `max_failures` within `window_s` an
address may not try again until the window has moved on (429). Bounded: at most
`max_addresses` are remembered, the oldest forgotten first."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_ADDRESSES = 4096


@dataclass
class LoginThrottle:
    max_failures: int = MAX_FAILURES
    window_s: float = WINDOW_S
    max_addresses: int = MAX_ADDRESSES
    #: Logins refused without checking the password.
    refused: int = 0
    #: Addresses forgotten to stay within `max_addresses`.
    forgotten: int = 0
    _failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)

    def allows(self, address: str, now: float) -> bool:
        """May `address` try a password now? Counts a refusal if not."""
        failures = self._failures.get(address)
        if failures is None:
            return True
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if len(failures) < self.max_failures:
            return True
        self.refused += 1
        return False

    def failed(self, address: str, now: float) -> None:
        failures = self._failures.pop(address, None) or deque(maxlen=self.max_failures)
        failures.append(now)
        self._failures[address] = failures
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
            self.forgotten += 1

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)
