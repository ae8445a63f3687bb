"""Python's cyclic garbage collector held off while a model loads.

Loading builds hundreds of thousands of long-lived objects (the vocabulary, the tensors'
records, torch's import) and no garbage cycles, so every collection on the way scans objects
that all survive; pausing the collector skips that work (about a tenth of a second on a
150k-token vocabulary) and the first collection after the load catches up on anything left.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
