"""KeyedBackoff: when each failed key may be tried again (doubling back-off, capped), for a
bounded number of keys. A plain class with the time passed in: no clock, no threads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class KeyedBackoff:
    """`ready(key, now)` is False while a key's back-off runs; `failed` starts or doubles it;
    `succeeded` forgets the key. Past `max_keys` the least recently failed key is forgotten (at
    worst it is tried again early)."""

    def __init__(self, first_s: float, max_s: float, max_keys: int) -> None:
        if not 0 < first_s <= max_s or max_keys < 1:
            raise ValueError("need 0 < first_s <= max_s and max_keys >= 1")
        self._first_s = first_s
        self._max_s = max_s
        self._max_keys = max_keys
        self._keys: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # not before, next

    def __len__(self) -> int:
        return len(self._keys)

    def ready(self, key: Hashable, now: float) -> bool:
        entry = self._keys.get(key)
        return entry is None or now >= entry[0]

    def failed(self, key: Hashable, now: float) -> float:
        """Record a failure; the back-off (s) that now runs for `key`."""
        entry = self._keys.pop(key, None)
        wait_s = self._first_s if entry is None else entry[1]
        self._keys[key] = (now + wait_s, min(wait_s * 2, self._max_s))
        while len(self._keys) > self._max_keys:
            self._keys.popitem(last=False)
        return wait_s

    def succeeded(self, key: Hashable) -> None:
        self._keys.pop(key, None)
