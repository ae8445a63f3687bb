"""The watchdog: stops the server when an engine is dead or stalled, so that the process
exits non-zero and a supervisor restarts it."""

from __future__ import annotations

import logging
import time
from typing import Any

from tessera.plugins.server.state import ServerState, engine_problem

log = logging.getLogger("tessera.server")

#: Exit code when the watchdog stopped the server (EX_SOFTWARE): a supervisor restarts it.
EXIT_UNHEALTHY = 70


class Watchdog:
    """Stops the server when an engine is dead or stalled (see ``SlotEngine.health``), so
    that the process exits non-zero and a supervisor (systemd, Kubernetes) restarts it."""

    def __init__(self, state: ServerState, srv: Any, every_s: float = 1.0) -> None:
        self.state, self.srv, self.every_s = state, srv, every_s
        self.reason: str | None = None

    def check(self) -> str | None:
        """The first unhealthy engine's reason, or None."""
        return engine_problem(self.state)

    def watch(self) -> None:
        while not self.srv.should_exit:
            time.sleep(self.every_s)
            reason = self.check()
            if reason is not None:
                log.error("%s; stopping so that a supervisor can restart the server", reason)
                self.reason = reason
                self.srv.should_exit = True
                return
