"""The expert cache (``--moe-cache-mib N``): a byte-budgeted LRU fast tier for MoE experts.

Offloaded experts (``--cpu-moe``, ``-ncmoe N``) live in the slow tier, the memory-mapped
GGUF file, possibly quantized. Using one means converting it to the form the backend
multiplies fastest (on CPU: dequantized or repacked; on a GPU: also moved to device
memory). This cache keeps the converted experts that tokens actually use, least recently
used out first, never holding more than its byte budget, so a hit skips the conversion a
miss pays. Trained routers reuse experts from token to token, which is what makes it pay.

Counters: ``hits``, ``misses``, ``evictions``, ``bytes_moved`` (backend-form bytes brought
in by misses), ``bytes_used`` / ``budget_bytes``. With ``--moe-cache-shared`` one cache
serves every model and backend of the runtime; its keys name the file, tensor and backend
form, so entries never mix.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tessera.contract.experts import ExpertCacheInfo, SlowExperts, loaded_nbytes
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


class ExpertCache:
    """An LRU of converted experts keyed by ``(slow tier key, expert)``, within a byte budget."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the expert cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.bytes_used = 0
        self.hits = self.misses = self.evictions = self.bytes_moved = 0
        self._entries: OrderedDict[tuple[str, int], tuple[Any, int]] = OrderedDict()
        # Several backends (threads) may share one cache with --moe-cache-shared.
        self._lock = threading.Lock()

    def wrap(self, slow: SlowExperts) -> CachedExperts:
        return CachedExperts(self, slow)

    def fetch(self, slow: SlowExperts, expert: int) -> tuple[Any, Any, Any]:
        """Expert ``expert`` of ``slow``: from the cache (a hit) or converted (a miss)."""
        with self._lock:
            return self._fetch(slow, expert)

    def fetch_many(self, slow: SlowExperts, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        """:meth:`fetch` for each of ``experts`` in order, under one lock acquisition (one
        call per layer and ubatch: the hit path pays no per-expert locking)."""
        with self._lock:
            return [self._fetch(slow, e) for e in experts]

    def _fetch(self, slow: SlowExperts, expert: int) -> tuple[Any, Any, Any]:
        key = (slow.key, expert)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]
        weights = slow.load(expert)
        size = sum(loaded_nbytes(w) for w in weights)
        self.misses += 1
        self.bytes_moved += size
        if size <= self.budget_bytes:  # an expert larger than the budget is not kept
            while self.bytes_used + size > self.budget_bytes:
                _, (_, old) = self._entries.popitem(last=False)
                self.bytes_used -= old
                self.evictions += 1
            self._entries[key] = (weights, size)
            self.bytes_used += size
        return weights

    def keys(self) -> list[tuple[str, int]]:
        """Cached ``(slow tier key, expert)`` pairs, least recently used first."""
        with self._lock:
            return list(self._entries)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            lookups = self.hits + self.misses
            return {
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "bytes_moved": self.bytes_moved,
                "bytes_used": self.bytes_used,
                "budget_bytes": self.budget_bytes,
                "entries": len(self._entries),
                "hit_rate": self.hits / lookups if lookups else 0.0,
            }

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes_used = 0


class CachedExperts:
    """One layer's experts, served through an :class:`ExpertCache`."""

    def __init__(self, cache: ExpertCache, slow: SlowExperts) -> None:
        self.cache, self.slow = cache, slow
        self.n_expert = slow.n_expert

    def get(self, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        return self.cache.fetch_many(self.slow, experts)


@hookimpl
def tessera_register_expert_caches(register):
    register(
        ExpertCacheInfo(
            "lru",
            ExpertCache,
            "byte-budgeted LRU of experts in the backend's fast form (--moe-cache-mib)",
        )
    )
