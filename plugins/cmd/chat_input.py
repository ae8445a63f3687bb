"""``input`` for the chat prompt on a terminal, where a Ctrl-C always reaches the prompt.

CPython's readline waits for a key in ``select()`` and checks for signals only when a
signal interrupts that wait. A Ctrl-C that arrives after the prompt is drawn but before the
wait begins (typed right as the prompt appears, or by a process woken by the prompt's text)
is recorded and not acted on: no ``KeyboardInterrupt`` until the user's next line, which it
then swallows. While the line is read, a helper thread nudges the reading thread with a
signal whose handler does nothing, so such a recorded Ctrl-C is raised within one nudge.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

#: How often the waiting prompt looks for a Ctrl-C that arrived before its wait began.
NUDGE_SECONDS = 0.1

#: The signal that only wakes the wait (its handler does nothing); not SIGWINCH, which
#: readline takes as a window resize and redraws.
_NUDGE = getattr(signal, "SIGUSR1", None)


def _nudge_until(stop: threading.Event, thread_id: int) -> None:
    while not stop.wait(NUDGE_SECONDS):
        signal.pthread_kill(thread_id, _NUDGE)


def interruptible_input(prompt: str = "", read: Callable[[str], str] = input) -> str:
    """``read(prompt)``, where a Ctrl-C raises ``KeyboardInterrupt`` however early it came.

    Called outside the main thread, or where threads cannot be signalled (Windows), it is
    plain ``read``: signals are handled in the main thread only.
    """
    main = threading.main_thread()
    if _NUDGE is None or threading.current_thread() is not main:
        return read(prompt)
    previous = signal.signal(_NUDGE, lambda signum, frame: None)
    stop = threading.Event()
    nudger = threading.Thread(target=_nudge_until, args=(stop, main.ident), daemon=True)
    try:
        nudger.start()
        return read(prompt)
    finally:
        stop.set()
        if nudger.is_alive():
            nudger.join()  # no nudge may come after the old handler is back
        signal.signal(_NUDGE, signal.SIG_DFL if previous is None else previous)
