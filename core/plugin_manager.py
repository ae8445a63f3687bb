"""The plugin manager: finds entry-point plugins, loads them safely, builds the catalogues.

A :class:`Runtime` is the only holder of plugin state. It loads the ``tessera`` entry-point
group one plugin at a time; a plugin that fails to import, declares the wrong plugin-API
version or fails to register is recorded in :attr:`Runtime.failures` and skipped (strict
mode raises instead). Environment switches (declared in :mod:`tessera.switches`), read
when a Runtime is made:

- ``TESSERA_DISABLE_PLUGINS=a,b``: entry-point names not to load (also ``--disable-plugins``).
- ``TESSERA_PLUGINS=a,b``: load only these entry points (an allowlist, for tests).
- ``TESSERA_STRICT_PLUGINS=1``: raise :class:`PluginError` on the first broken plugin.
- ``TESSERA_TRACE_HOOKS=1``: print every hook call and result to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from tessera import PLUGIN_API_VERSION, hookspecs, switches
from tessera.catalogue import Catalogues
from tessera.errors import PluginError

ENTRY_POINT_GROUP = "tessera"


@attrs.frozen
class PluginFailure:
    """A plugin that could not be loaded or registered, and why."""

    name: str
    error: str


@attrs.frozen
class PluginRecord:
    """A loaded plugin: its entry-point name, distribution and version."""

    name: str
    module: str
    distribution: str
    version: str


class Runtime(Catalogues):
    """Loaded plugins and the catalogues they registered (backends, architectures ...)."""

    def __init__(
        self,
        *,
        disabled: Iterable[str] = (),
        only: Iterable[str] | None = None,
        strict: bool | None = None,
        entry_points: Iterable[Any] | None = None,
        on_failure: Callable[[PluginFailure], None] | None = None,
    ) -> None:
        """``on_failure`` is called with each :class:`PluginFailure` as it happens (the CLI
        prints a warning), at load time or later when a catalogue hook raises."""
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.on_failure = on_failure
        self.pm.add_hookspecs(hookspecs)
        self.strict = switches.flag(switches.STRICT_PLUGINS) if strict is None else strict
        self.disabled = set(disabled) | set(switches.names(switches.DISABLE_PLUGINS))
        allow = switches.names(switches.PLUGINS) if only is None else list(only)
        self.only = set(allow) if allow else None
        self.plugins: list[PluginRecord] = []
        self.failures: list[PluginFailure] = []
        self.conflicts: list[str] = []
        self._catalogues: dict[str, dict[Any, Any]] = {}
        self._owners: dict[str, dict[Any, str]] = {}
        self._shared_expert_cache: Any = None
        if switches.flag(switches.TRACE_HOOKS):
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self._load(_find_entry_points() if entry_points is None else entry_points)

    # -- loading ---------------------------------------------------------------------

    def _fail(self, name: str, error: str) -> None:
        if self.strict:
            raise PluginError(f"plugin '{name}' failed to load: {error}")
        failure = PluginFailure(name, error)
        self.failures.append(failure)
        if self.on_failure is not None:
            self.on_failure(failure)

    def _load(self, entry_points: Iterable[Any]) -> None:
        distributions: dict[Any, tuple[str, str]] = {}
        for ep in entry_points:
            if ep.name in self.disabled or (self.only is not None and ep.name not in self.only):
                continue
            try:
                module = ep.load()
            except Exception as exc:
                self._fail(ep.name, f"{type(exc).__name__}: {exc}")
                continue
            self.add_plugin(module, ep.name, _distribution_of(ep, distributions))

    def add_plugin(self, module: Any, name: str, distribution: tuple[str, str] = ("", "")) -> bool:
        """Register one plugin object; returns False (or raises in strict mode) if refused."""
        api = getattr(module, "TESSERA_PLUGIN_API", None)
        if api is None:
            self._fail(
                name,
                "does not declare TESSERA_PLUGIN_API; a plugin module must state the plugin-API "
                f"version it was written for (this tessera speaks {PLUGIN_API_VERSION})",
            )
            return False
        if api != PLUGIN_API_VERSION:
            self._fail(
                name,
                f"declares TESSERA_PLUGIN_API={api!r} but this tessera speaks "
                f"{PLUGIN_API_VERSION}; upgrade the plugin or tessera",
            )
            return False
        try:
            self.pm.register(module, name=name)
            # A hookimpl whose name matches no hook spec (a typo) would otherwise never run.
            self.pm.check_pending()
        except Exception as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._fail(name, f"{type(exc).__name__}: {exc}")
            return False
        module_name = getattr(module, "__name__", type(module).__name__)
        self.plugins.append(PluginRecord(name, module_name, *distribution))
        self._catalogues.clear()
        self._owners.clear()
        return True

    def hooks_of(self, name: str) -> list[str]:
        """Names of the hooks that plugin ``name`` implements."""
        plugin = self.pm.get_plugin(name)
        return sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])

    def shared_expert_cache(self, budget_bytes: int) -> Any | None:
        """The one expert cache of ``--moe-cache-shared``, made on first use with the first
        registered expert cache (None when no expert-cache plugin is loaded). Later callers
        share it, whatever budget they ask for: the first budget holds."""
        if self._shared_expert_cache is None and self.expert_caches():
            info = next(iter(self.expert_caches().values()))
            self._shared_expert_cache = info.create(budget_bytes)
        return self._shared_expert_cache


def _find_entry_points() -> list[Any]:
    from importlib_metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _distribution_of(ep: Any, seen: dict[Any, tuple[str, str]]) -> tuple[str, str]:
    """Name and version of the entry point's distribution; ``seen`` keeps them per
    distribution, as every read of ``dist.metadata`` parses its METADATA file again."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("", "")
    if dist not in seen:
        metadata = dist.metadata
        seen[dist] = (metadata["Name"] or "", metadata["Version"] or "")
    return seen[dist]
