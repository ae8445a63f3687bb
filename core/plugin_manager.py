"""The plugin manager: finds entry-point plugins, loads them safely, builds the catalogues.

A :class:`Runtime` is the only holder of plugin state. It loads the ``tessera`` entry-point
group one plugin at a time; a plugin that fails to import, declares the wrong plugin-API
version or fails to register is recorded in :attr:`Runtime.failures` and skipped (strict
mode raises instead). Environment switches:

- ``TESSERA_DISABLE_PLUGINS=a,b``: entry-point names not to load (also ``--disable-plugins``).
- ``TESSERA_PLUGINS=a,b``: load only these entry points (an allowlist, for tests).
- ``TESSERA_STRICT_PLUGINS=1``: raise :class:`PluginError` on the first broken plugin.
- ``TESSERA_TRACE_HOOKS=1``: print every hook call and result to stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from tessera import PLUGIN_API_VERSION, hookspecs
from tessera.errors import (
    PluginError,
    TesseraError,
    UnknownArchitectureError,
    UnknownBackendError,
    UnknownQuantTypeError,
)

ENTRY_POINT_GROUP = "tessera"


def env_list(name: str) -> list[str]:
    """A comma-separated environment variable as a list of non-empty names."""
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


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


class Runtime:
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
        self.strict = env_flag("TESSERA_STRICT_PLUGINS") if strict is None else strict
        self.disabled = set(disabled) | set(env_list("TESSERA_DISABLE_PLUGINS"))
        allow = env_list("TESSERA_PLUGINS") if only is None else list(only)
        self.only = set(allow) if allow else None
        self.plugins: list[PluginRecord] = []
        self.failures: list[PluginFailure] = []
        self.conflicts: list[str] = []
        self._catalogues: dict[str, dict[Any, Any]] = {}
        self._shared_expert_cache: Any = None
        if env_flag("TESSERA_TRACE_HOOKS"):
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
        for ep in entry_points:
            if ep.name in self.disabled or (self.only is not None and ep.name not in self.only):
                continue
            try:
                module = ep.load()
            except Exception as exc:
                self._fail(ep.name, f"{type(exc).__name__}: {exc}")
                continue
            self.add_plugin(module, ep.name, _distribution_of(ep))

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
        return True

    def hooks_of(self, name: str) -> list[str]:
        """Names of the hooks that plugin ``name`` implements."""
        plugin = self.pm.get_plugin(name)
        return sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])

    # -- catalogues ------------------------------------------------------------------

    def _catalogue(
        self, hook: str, key: Callable[[Any], Iterable[Any]], index: str = ""
    ) -> dict[Any, Any]:
        """Call a ``register`` hook once per plugin and index what it registered by ``key``.

        Each plugin's implementation is called on its own, so one failing plugin is
        reported and skipped instead of hiding the others.
        """
        # One hook may be indexed two ways (architectures by GGUF name and by HF type).
        cache_key = f"{hook}:{index}"
        if cache_key in self._catalogues:
            return self._catalogues[cache_key]
        found: dict[Any, Any] = {}
        caller = getattr(self.pm.hook, hook)
        for impl in caller.get_hookimpls():  # in registration (entry-point) order
            registered: list[Any] = []
            try:
                impl.function(register=registered.append)
            except Exception as exc:
                self._fail(impl.plugin_name, f"{hook} raised {type(exc).__name__}: {exc}")
                continue
            for item in registered:
                for k in key(item):
                    if k in found:
                        self.conflicts.append(
                            f"{impl.plugin_name}: {hook} registered {k!r} again; kept the first"
                        )
                    else:
                        found[k] = item
        self._catalogues[cache_key] = found
        return found

    def backends(self) -> dict[str, Any]:
        return self._catalogue("tessera_register_backends", lambda b: [b.name])

    def architectures(self) -> dict[str, Any]:
        return self._catalogue("tessera_register_architectures", lambda a: a.names)

    def hf_architectures(self) -> dict[str, Any]:
        return self._catalogue(
            "tessera_register_architectures", lambda a: a.hf_model_types, index="hf"
        )

    def quant_types(self) -> dict[int, Any]:
        return self._catalogue("tessera_register_quant_types", lambda q: [q.ggml_type])

    def weight_kernels(self) -> dict[tuple[str, str], Any]:
        return self._catalogue(
            "tessera_register_weight_kernels", lambda k: [(k.backend, k.quant_type)]
        )

    def commands(self) -> dict[str, Any]:
        return self._catalogue("tessera_register_commands", lambda c: [c.name])

    def routes(self) -> dict[str, Any]:
        """Server routes by ``"METHOD /path"`` (one route may own several keys)."""
        return self._catalogue(
            "tessera_register_routes", lambda r: [f"{m} {r.path}" for m in r.methods]
        )

    def expert_caches(self) -> dict[str, Any]:
        """Expert caches (:class:`tessera.contract.experts.ExpertCacheInfo`) by name."""
        return self._catalogue("tessera_register_expert_caches", lambda c: [c.name])

    def shared_expert_cache(self, budget_bytes: int) -> Any | None:
        """The one expert cache of ``--moe-cache-shared``, made on first use with the first
        registered expert cache (None when no expert-cache plugin is loaded). Later callers
        share it, whatever budget they ask for: the first budget holds."""
        if self._shared_expert_cache is None and self.expert_caches():
            info = next(iter(self.expert_caches().values()))
            self._shared_expert_cache = info.create(budget_bytes)
        return self._shared_expert_cache

    def communicators(self) -> dict[str, Any]:
        """Communicators (:class:`tessera.contract.comm.CommunicatorInfo`) by name."""
        return self._catalogue("tessera_register_communicators", lambda c: [c.name])

    def spec_decoders(self) -> dict[str, Any]:
        """Speculative decoders (:class:`tessera.contract.spec.SpecDecoderInfo`) by name."""
        return self._catalogue("tessera_register_spec_decoders", lambda d: [d.name])

    def spec_decoder(self, name: str) -> Any:
        """The spec decoder registered as ``name`` (``--spec-type``), or a clear error."""
        decoders = self.spec_decoders()
        if name not in decoders:
            known = ", ".join(sorted(decoders)) or "none (no spec-decoder plugin is loaded)"
            raise TesseraError(
                f"unknown speculative decoding type '{name}'; the installed types are: "
                f"{known}. Pick one with --spec-type or install its plugin"
            )
        return decoders[name]

    # -- lookups with user-facing errors --------------------------------------------

    def architecture(self, name: str) -> Any:
        archs = self.architectures()
        if name not in archs:
            known = ", ".join(sorted(archs)) or "none (no architecture plugin is loaded)"
            raise UnknownArchitectureError(
                f"unknown model architecture '{name}'; the installed architectures are: "
                f"{known}. Install a plugin for '{name}' or use a supported model"
            )
        return archs[name]

    def hf_architecture(self, model_type: str) -> Any:
        archs = self.hf_architectures()
        if model_type not in archs:
            known = ", ".join(sorted(archs)) or "none"
            raise UnknownArchitectureError(
                f"unknown Hugging Face model_type '{model_type}'; the installed architectures "
                f"load: {known}. Install a plugin for it or use a supported model"
            )
        return archs[model_type]

    def quant_type(self, ggml_type: int, tensor: str = "") -> Any:
        qtypes = self.quant_types()
        if ggml_type not in qtypes:
            where = f" of tensor '{tensor}'" if tensor else ""
            known = ", ".join(q.name for q in qtypes.values()) or "none"
            raise UnknownQuantTypeError(
                f"unknown tensor type {_ggml_type_name(ggml_type)}{where}; the installed quant "
                f"types are: {known}. Install a plugin for it or requantize the model"
            )
        return qtypes[ggml_type]

    def quant_type_by_name(self, name: str) -> Any:
        for q in self.quant_types().values():
            if q.name.lower() == name.lower():
                return q
        known = ", ".join(q.name for q in self.quant_types().values()) or "none"
        raise UnknownQuantTypeError(
            f"unknown quant type '{name}'; the installed quant types are: {known}"
        )

    def backend_preference(self) -> list[str]:
        """Installed backend names, best first: torch (the fast one), then the rest by name."""
        names = sorted(self.backends())
        return sorted(names, key=lambda n: n != "torch")

    def create_backend(
        self, name: str | None = None, device: str | None = None, dtype: str | None = None
    ) -> Any:
        """Create a backend by name; with no name, the first in preference that can run here."""
        backends = self.backends()
        if name is None:
            for candidate in self.backend_preference():
                try:
                    return backends[candidate].create(device, dtype)
                except UnknownBackendError:
                    continue
            raise UnknownBackendError(
                "no usable backend is installed; install torch or enable the numpy backend"
            )
        if name not in backends:
            known = ", ".join(sorted(backends)) or "none"
            raise UnknownBackendError(
                f"unknown backend '{name}'; the installed backends are: {known}"
            )
        return backends[name].create(device, dtype)


def _ggml_type_name(ggml_type: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(ggml_type).name} (GGML type {ggml_type})"
    except ValueError:
        return f"GGML type {ggml_type}"


def _find_entry_points() -> list[Any]:
    from importlib_metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _distribution_of(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("", "")
    return (dist.metadata["Name"] or "", dist.version or "")
