"""Progress bars of the long steps: loading a model, quantizing, converting, building a
random-weight model for ``tessera bench``.

Every bar goes to stderr and is drawn only when stderr is a terminal, so pipes, logs and
captured output never receive one; stdout (generated text, tables, JSON) is never touched.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(
    items: Iterable[T], desc: str, unit: str = "tensor", total: int | None = None
) -> Iterator[T]:
    """``items``, with a bar named ``desc`` on a terminal's stderr (none elsewhere); the bar
    is erased when the step ends, so what the command prints next starts a clean line."""
    from tqdm import tqdm

    # disable=None: tqdm draws only when its file is a terminal
    return iter(
        tqdm(items, desc=desc, unit=unit, total=total, leave=False, disable=None, file=sys.stderr)
    )
