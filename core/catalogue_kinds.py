"""The kinds of thing a plugin can register: for each, the ``register`` hook that fills its
catalogue, the key(s) an item is found by, and the words of the error when a name is
missing (:meth:`tessera.catalogue.Catalogues.get` reads them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from tessera import switches
from tessera.errors import (
    UnknownArchitectureError,
    UnknownBackendError,
    UnknownNameError,
    UnknownQuantTypeError,
    UnknownSpecDecoderError,
    UnknownTokenizerError,
)


@attrs.frozen
class CatalogueKind:
    """One catalogue: filled by ``hook``, indexed by ``keys(item)``."""

    hook: str
    keys: Callable[[Any], Iterable[Any]] = attrs.field(eq=False)
    #: Raised by :meth:`Catalogues.get` for a missing name.
    error: type[UnknownNameError] = UnknownNameError
    #: ``{name}``, ``{known}`` (the installed names) and ``{where}`` are filled in.
    missing: str = "unknown '{name}'; installed: {known}"
    #: ``{known}`` when nothing of the kind is installed.
    none: str = "none"
    #: How an installed item is named in ``{known}`` (None: its key, names sorted; else
    #: this function of the item, in registration order).
    label: Callable[[Any], str] | None = attrs.field(default=None, eq=False)
    #: Items the core itself provides, ahead of every plugin's (their owner is "core").
    builtin: tuple[Any, ...] = attrs.field(default=(), eq=False)


KINDS: dict[str, CatalogueKind] = {
    "backend": CatalogueKind(
        "tessera_register_backends",
        lambda b: [b.name],
        UnknownBackendError,
        "unknown backend '{name}'; the installed backends are: {known}",
    ),
    "architecture": CatalogueKind(
        "tessera_register_architectures",
        lambda a: a.names,
        UnknownArchitectureError,
        "unknown model architecture '{name}'; the installed architectures are: {known}. "
        "Install a plugin for '{name}' or use a supported model",
        none="none (no architecture plugin is loaded)",
    ),
    "hf_architecture": CatalogueKind(
        "tessera_register_architectures",
        lambda a: a.hf_model_types,
        UnknownArchitectureError,
        "unknown Hugging Face model_type '{name}'; the installed architectures load: "
        "{known}. Install a plugin for it or use a supported model",
    ),
    "hf_class": CatalogueKind(
        "tessera_register_architectures",
        lambda a: a.hf_classes,
        UnknownArchitectureError,
        "unknown Hugging Face model class '{name}'; the installed architectures load: {known}",
    ),
    "quant_type": CatalogueKind(
        "tessera_register_quant_types",
        lambda q: [q.ggml_type],
        UnknownQuantTypeError,
        "unknown tensor type {name}{where}; the installed quant types are: {known}. "
        "Install a plugin for it or requantize the model",
        label=lambda q: q.name,
    ),
    "quant_type_name": CatalogueKind(
        "tessera_register_quant_types",
        lambda q: [q.name.lower()],
        UnknownQuantTypeError,
        "unknown quant type '{name}'; the installed quant types are: {known}",
        label=lambda q: q.name,
    ),
    "weight_kernel": CatalogueKind(
        "tessera_register_weight_kernels", lambda k: [(k.backend, k.quant_type)]
    ),
    "block_fusion": CatalogueKind(
        "tessera_register_block_fusions", lambda f: [(f.backend, f.block)]
    ),
    "command": CatalogueKind("tessera_register_commands", lambda c: [c.name]),
    "route": CatalogueKind(
        "tessera_register_routes", lambda r: [f"{m} {r.path}" for m in r.methods]
    ),
    "expert_cache": CatalogueKind("tessera_register_expert_caches", lambda c: [c.name]),
    "communicator": CatalogueKind("tessera_register_communicators", lambda c: [c.name]),
    "switch": CatalogueKind(
        "tessera_register_switches",
        lambda s: [s.name],
        UnknownNameError,
        "unknown switch '{name}'; the declared switches are: {known}",
        builtin=switches.CORE_SWITCHES,
    ),
    "spec_decoder": CatalogueKind(
        "tessera_register_spec_decoders",
        lambda d: [d.name],
        UnknownSpecDecoderError,
        "unknown speculative decoding type '{name}'; the installed types are: {known}. "
        "Pick one with --spec-type or install its plugin",
        none="none (no spec-decoder plugin is loaded)",
    ),
    "constraint": CatalogueKind(
        "tessera_register_constraints",
        lambda k: [k.name],
        UnknownNameError,
        "unknown constraint kind '{name}'; the installed kinds are: {known}",
    ),
    "tokenizer_kind": CatalogueKind(
        "tessera_register_tokenizer_kinds",
        lambda k: k.models,
        UnknownTokenizerError,
        "tokenizer model '{name}' is not supported; the core runs {where}, the installed "
        "plugins {known}. Use a model with one of those vocabularies or install its plugin",
        label=lambda k: ", ".join(k.models),
    ),
}
