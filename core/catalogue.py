"""The catalogues plugins register into, and the one lookup that names what is installed.

Each kind of thing a plugin can register (backend, architecture, quant type ...) is a
:class:`~tessera.catalogue_kinds.CatalogueKind` in :data:`KINDS`: the ``register`` hook
that fills it, the key(s) each item is found by, and the words of the error when a name is
missing. :meth:`Catalogues.get` is the one lookup: the item, or an
:class:`~tessera.errors.UnknownNameError` subclass whose message lists what is installed
and the way out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tessera.catalogue_kinds import KINDS
from tessera.errors import UnknownBackendError


def _ggml_type_name(ggml_type: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(ggml_type).name} (GGML type {ggml_type})"
    except ValueError:
        return f"GGML type {ggml_type}"


class Catalogues:
    """What the loaded plugins registered, one catalogue per :data:`KINDS` entry.

    The plugin manager (:class:`tessera.plugin_manager.Runtime`) is the concrete class: it
    provides ``pm`` (pluggy's manager), ``conflicts``, ``_fail`` and the caches.
    """

    pm: Any
    conflicts: list[str]
    _catalogues: dict[str, dict[Any, Any]]
    #: By kind, the plugin name (or "core") that registered each key.
    _owners: dict[str, dict[Any, str]]
    #: Report plugin ``name`` as broken with ``error`` (the manager records it, or raises
    #: in strict mode).
    _fail: Callable[[str, str], None]

    def catalogue(self, kind: str) -> dict[Any, Any]:
        """Every item of ``kind`` by key. Each plugin's ``register`` hook is called on its
        own, so one failing plugin is reported and skipped instead of hiding the others."""
        if kind in self._catalogues:
            return self._catalogues[kind]
        spec = KINDS[kind]
        found: dict[Any, Any] = {k: item for item in spec.builtin for k in spec.keys(item)}
        owners = dict.fromkeys(found, "core")
        caller = getattr(self.pm.hook, spec.hook)
        for impl in caller.get_hookimpls():  # in registration (entry-point) order
            registered: list[Any] = []
            try:
                impl.function(register=registered.append)
            except Exception as exc:
                self._fail(impl.plugin_name, f"{spec.hook} raised {type(exc).__name__}: {exc}")
                continue
            for item in registered:
                for k in spec.keys(item):
                    if k in found:
                        self.conflicts.append(
                            f"{impl.plugin_name}: {spec.hook} registered {k!r} again; "
                            "kept the first"
                        )
                    else:
                        found[k] = item
                        owners[k] = impl.plugin_name
        self._catalogues[kind] = found
        self._owners[kind] = owners
        return found

    def owners(self, kind: str) -> dict[Any, str]:
        """Who registered each item of ``kind``, by key: a plugin's name, or "core"."""
        self.catalogue(kind)
        return self._owners[kind]

    def get(self, kind: str, name: Any, *, where: str = "", shown: str | None = None) -> Any:
        """The item of ``kind`` registered as ``name``, or the kind's typed error listing
        what is installed. ``shown`` is how the message names ``name`` (default: as is);
        ``where`` adds context, e.g. the tensor a type was met in."""
        found = self.catalogue(kind)
        if name in found:
            return found[name]
        spec = KINDS[kind]
        if spec.label is None:
            labels = sorted(str(k) for k in found)
        else:
            labels = list(dict.fromkeys(spec.label(item) for item in found.values()))
        known = ", ".join(labels) or spec.none
        shown = str(name) if shown is None else shown
        raise spec.error(spec.missing.format(name=shown, known=known, where=where))

    # -- the catalogues by kind (what callers read) ----------------------------------

    def backends(self) -> dict[str, Any]:
        return self.catalogue("backend")

    def architectures(self) -> dict[str, Any]:
        return self.catalogue("architecture")

    def quant_types(self) -> dict[int, Any]:
        return self.catalogue("quant_type")

    def weight_kernels(self) -> dict[tuple[str, str], Any]:
        return self.catalogue("weight_kernel")

    def block_fusions(self) -> dict[tuple[str, str], Any]:
        """Block fusions (:class:`tessera.contract.fusion.BlockFusion`) by (backend, block)."""
        return self.catalogue("block_fusion")

    def equip(self, backend: Any) -> Any:
        """Hand ``backend`` the weight kernels and block fusions registered for it (the
        loader does this before loading weights); returns it."""
        backend.use_kernels(self.weight_kernels())
        backend.use_fusions(self.block_fusions())
        return backend

    def commands(self) -> dict[str, Any]:
        return self.catalogue("command")

    def routes(self) -> dict[str, Any]:
        """Server routes by ``"METHOD /path"`` (one route may own several keys)."""
        return self.catalogue("route")

    def expert_caches(self) -> dict[str, Any]:
        """Expert caches (:class:`tessera.contract.experts.ExpertCacheInfo`) by name."""
        return self.catalogue("expert_cache")

    def communicators(self) -> dict[str, Any]:
        """Communicators (:class:`tessera.contract.comm.CommunicatorInfo`) by name."""
        return self.catalogue("communicator")

    def spec_decoders(self) -> dict[str, Any]:
        """Speculative decoders (:class:`tessera.contract.spec.SpecDecoderInfo`) by name."""
        return self.catalogue("spec_decoder")

    def constraint_kinds(self) -> dict[str, Any]:
        """Constraint kinds (:class:`tessera.contract.constraints.ConstraintKind`) by name."""
        return self.catalogue("constraint")

    def switches(self) -> dict[str, Any]:
        """Environment switches (:class:`tessera.switches.Switch`) by variable name: core's
        first, then each plugin's; :meth:`owners` says whose each one is."""
        return self.catalogue("switch")

    # -- single lookups (``get`` with each kind's name) ------------------------------

    def architecture(self, name: str) -> Any:
        return self.get("architecture", name)

    def hf_architecture(self, model_type: str) -> Any:
        return self.get("hf_architecture", model_type)

    def hf_architecture_for(self, hf_config: Mapping[str, Any]) -> Any:
        """The architecture of an HF ``config.json``: the one registered for one of its
        ``architectures`` class names, else the one for its ``model_type``."""
        classes = self.catalogue("hf_class")
        found = [classes[c] for c in hf_config.get("architectures") or () if c in classes]
        return found[0] if found else self.hf_architecture(hf_config["model_type"])

    def quant_type(self, ggml_type: int, tensor: str = "") -> Any:
        where = f" of tensor '{tensor}'" if tensor else ""
        return self.get("quant_type", ggml_type, where=where, shown=_ggml_type_name(ggml_type))

    def quant_type_by_name(self, name: str) -> Any:
        return self.get("quant_type_name", name.lower(), shown=name)

    def spec_decoder(self, name: str) -> Any:
        """The spec decoder registered as ``name`` (``--spec-type``), or a clear error."""
        return self.get("spec_decoder", name)

    def constraint_kind(self, name: str) -> Any:
        return self.get("constraint", name)

    def backend_preference(self) -> list[str]:
        """Installed backend names, best first: by :attr:`BackendInfo.priority`, then name."""
        backends = self.backends()
        return sorted(backends, key=lambda n: (-getattr(backends[n], "priority", 0), n))

    def create_backend(
        self, name: str | None = None, device: str | None = None, dtype: str | None = None
    ) -> Any:
        """Create a backend by name; with no name, the first in preference that can run here."""
        if name is not None:
            return self.get("backend", name).create(device, dtype)
        backends = self.backends()
        for candidate in self.backend_preference():
            try:
                return backends[candidate].create(device, dtype)
            except UnknownBackendError:
                continue
        raise UnknownBackendError(
            "no usable backend is installed; install torch or enable the numpy backend"
        )
