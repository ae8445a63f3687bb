"""Slot files: a slot's cached tokens and K/V written to a file and read back, and the
slot erased (the server's ``/slots/{id}?action=save|restore|erase``).

:class:`SlotFiles` is the part of :class:`tessera.engine.slots.SlotEngine` that does it;
each action runs on the engine thread between two steps, on an idle slot only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tessera.engine.context import Context
from tessera.engine.slot_types import Slot, SlotBusyError, SlotError, SlotNotFoundError

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def slot_file_path(directory: str | Path, filename: str) -> Path:
    """``directory / filename`` for a slot file, refusing anything but a plain file name."""
    if not isinstance(filename, str) or not _SAFE_NAME.fullmatch(filename) or ".." in filename:
        raise SlotError(
            f"invalid slot file name {filename!r}: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, with no path separators or '..'"
        )
    return Path(directory) / filename


class SlotFiles:
    """Save, restore and erase one slot's cache (mixed into the slot engine)."""

    ctx: Context
    slots: list[Slot]
    call: Callable[..., Any]

    def save_slot(self, id_slot: int, path: Path) -> dict[str, Any]:
        """Write slot ``id_slot``'s cached tokens and K/V to ``path`` (atomically)."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "saved")
            t0 = time.perf_counter()
            self.ctx.save_state(path, seq_id=slot.id, tokens=slot.cache_tokens)
            return {
                "id_slot": slot.id,
                "filename": path.name,
                "n_saved": len(slot.cache_tokens),
                "n_written": path.stat().st_size,
                "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
            }

        return self.call(work)

    def restore_slot(self, id_slot: int, path: Path) -> dict[str, Any]:
        """Replace slot ``id_slot``'s cache with the state saved in ``path``."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "restored")
            if not path.is_file():
                raise SlotNotFoundError(f"no slot file named {path.name!r}; save one first")
            t0 = time.perf_counter()
            tokens = self.ctx.load_state(path, seq_id=slot.id)
            slot.cache_tokens = list(tokens)
            slot.last_used = time.monotonic()
            return {
                "id_slot": slot.id,
                "filename": path.name,
                "n_restored": len(tokens),
                "n_read": path.stat().st_size,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
            }

        return self.call(work)

    def erase_slot(self, id_slot: int) -> dict[str, Any]:
        """Drop slot ``id_slot``'s cached tokens and free their cells."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "erased")
            n = len(slot.cache_tokens)
            self.ctx.kv.seq_rm(slot.id, 0)
            slot.cache_tokens = []
            return {"id_slot": slot.id, "n_erased": n}

        return self.call(work)

    def _idle_slot(self, id_slot: int, action: str) -> Slot:
        if not 0 <= id_slot < len(self.slots):
            raise SlotNotFoundError(
                f"slot {id_slot} does not exist; this server has slots 0..{len(self.slots) - 1}"
            )
        slot = self.slots[id_slot]
        if slot.task is not None:
            raise SlotBusyError(
                f"slot {id_slot} is processing a request and cannot be {action} now; "
                "wait for it to finish"
            )
        return slot
