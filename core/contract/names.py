"""Name maps an architecture declares, and the generic code that executes them.

An architecture states as plain data how a Hugging Face checkpoint's tensor names map onto
GGUF's (:class:`TensorNames`) and where each config field is stored in GGUF metadata and
in HF ``config.json`` (:class:`ConfigField`); :func:`tensors_from_hf`,
:func:`fields_from_gguf`, :func:`fields_from_hf` and :func:`fields_to_gguf` do the loops and
lookups. What a map cannot say (a value derived from other fields or from tensor shapes, a
key written only for some configs) stays explicit code in the architecture, after the
generic part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import metadata_key
from tessera.errors import ModelFileError

#: A tensor transform: ``(hf_value, config) -> value`` in GGUF's layout.
Transform = Callable[[Any, Any], Any]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a :class:`ConfigField` that the file must state.
REQUIRED: Any = _Required()


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen
class TensorNames:
    """How a checkpoint's HF tensor names map onto GGUF tensor names.

    A name loses the first of ``prefixes`` it starts with; then it is skipped, or looked
    up in ``global_names``, or (under ``layer_prefix``, as ``{layer_prefix}N.rest``) its
    ``rest`` in ``layer_names``, giving ``blk.N.{layer_names[rest]}``.
    """

    #: HF name -> GGUF name, for the tensors outside the layers.
    global_names: Mapping[str, str]
    #: HF name inside layer N (after ``{layer_prefix}N.``) -> GGUF name after ``blk.N.``.
    layer_names: Mapping[str, str]
    #: How the error for an unknown tensor names the checkpoint and the plugin:
    #: "unexpected tensor 'x' in {checkpoint} checkpoint; the {plugin} plugin does not ...".
    checkpoint: str
    plugin: str
    layer_prefix: str = "model.layers."
    #: Prefixes a checkpoint may put before every name (``bert.`` in a classifier).
    prefixes: tuple[str, ...] = ()
    #: Names that hold nothing the model uses: skipped when they start or end with one.
    skip_prefixes: tuple[str, ...] = ()
    skip_suffixes: tuple[str, ...] = ()
    #: GGUF name (a layer's without ``blk.N.``) -> how its value is changed, always ...
    transforms: Mapping[str, Transform] = attrs.field(factory=dict)
    #: ... and only when writing a GGUF file (``for_gguf``: llama.cpp's layouts).
    gguf_transforms: Mapping[str, Transform] = attrs.field(factory=dict)

    def gguf_name(self, name: str) -> tuple[str, str] | None:
        """The GGUF name of HF ``name`` (prefix removed) and its key in the transforms;
        None for a name the map does not know."""
        if name in self.global_names:
            return self.global_names[name], self.global_names[name]
        if name.startswith(self.layer_prefix):
            layer, _, rest = name[len(self.layer_prefix) :].partition(".")
            if rest in self.layer_names:
                return f"blk.{layer}.{self.layer_names[rest]}", self.layer_names[rest]
        return None


def tensors_from_hf(
    names: TensorNames,
    config: Any,
    hf_tensors: Mapping[str, Any],
    for_gguf: bool,
    *,
    skip: tuple[str, ...] = (),
    checkpoint: str | None = None,
) -> Iterator[tuple[str, Any]]:
    """``(gguf_name, value)`` for every tensor of ``hf_tensors`` (read lazily, in their
    order) that ``names`` does not skip; a name it does not know is a ModelFileError.

    ``skip`` adds name prefixes this config skips (a tied ``lm_head.weight``);
    ``checkpoint`` replaces ``names.checkpoint`` in the error (a family naming its member).
    """
    transforms = {**names.transforms, **(names.gguf_transforms if for_gguf else {})}
    skip_prefixes = names.skip_prefixes + skip
    for hf_name in hf_tensors:
        name = next((hf_name[len(p) :] for p in names.prefixes if hf_name.startswith(p)), hf_name)
        if name.startswith(skip_prefixes) or name.endswith(names.skip_suffixes):
            continue
        found = names.gguf_name(name)
        if found is None:
            raise ModelFileError(
                f"unexpected tensor '{hf_name}' in {checkpoint or names.checkpoint} checkpoint; "
                f"the {names.plugin} plugin does not know where it goes"
            )
        gguf, key = found
        value = hf_tensors[hf_name]
        yield gguf, transforms[key](value, config) if key in transforms else value


@attrs.frozen
class ConfigField:
    """Where one config field is stored in GGUF metadata and in an HF ``config.json``."""

    #: The config's attribute.
    name: str
    #: GGUF keys after ``{arch}.``: read from the first, written to every one; none when
    #: GGUF does not store the field (or the architecture reads it in code).
    gguf: tuple[str, ...] = attrs.field(default=(), converter=_names)
    #: ``config.json`` fields: the first one present is read; none when HF has no field.
    hf: tuple[str, ...] = attrs.field(default=(), converter=_names)
    #: Turns a stored value into the config's type; None keeps it as stored (lists).
    type: Callable[[Any], Any] | None = int
    #: The value when the file does not state it (not converted); REQUIRED: it must.
    default: Any = REQUIRED
    #: The default for ``config.json`` when transformers' differs from llama.cpp's.
    hf_default: Any = attrs.field(default=attrs.Factory(lambda self: self.default, takes_self=True))
    #: Write no GGUF key when the value is the default (llama.cpp writes none either).
    omit_default: bool = False

    def convert(self, value: Any) -> Any:
        return value if self.type is None else self.type(value)


def fields_from_gguf(
    fields: Iterable[ConfigField], metadata: Mapping[str, Any], arch: str
) -> dict[str, Any]:
    """The config fields ``fields`` read from the GGUF keys ``{arch}.{key}``; a required
    key that is missing is :func:`tessera.contract.arch.metadata_key`'s error."""
    values = {}
    for field in fields:
        if not field.gguf:
            continue
        if field.default is REQUIRED:
            values[field.name] = field.convert(metadata_key(metadata, arch, field.gguf[0]))
            continue
        value = metadata.get(f"{arch}.{field.gguf[0]}")
        values[field.name] = field.default if value is None else field.convert(value)
    return values


def fields_from_hf(fields: Iterable[ConfigField], hf: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields ``fields`` read from an HF ``config.json`` dict (a field that is
    null counts as missing, as transformers treats it)."""
    values = {}
    for field in fields:
        if not field.hf:
            continue
        value = next((hf[n] for n in field.hf if hf.get(n) is not None), None)
        if value is not None:
            values[field.name] = field.convert(value)
        elif field.hf_default is not REQUIRED:
            values[field.name] = field.hf_default
        else:
            wanted = " or ".join(f"'{name}'" for name in field.hf)
            model = hf.get("model_type") or "Hugging Face"
            raise ModelFileError(
                f"config.json has no {wanted}, which a {model} model needs; the checkpoint "
                "is incomplete — download it again"
            )
    return values


def fields_to_gguf(fields: Iterable[ConfigField], config: Any, arch: str) -> dict[str, Any]:
    """GGUF metadata ``{arch}.{key}`` of ``config``'s fields (tuples written as arrays)."""
    metadata = {}
    for field in fields:
        value = getattr(config, field.name)
        if not field.gguf or (field.omit_default and value == field.default):
            continue
        for key in field.gguf:
            metadata[f"{arch}.{key}"] = list(value) if isinstance(value, tuple) else value
    return metadata


def default_head_dims(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` with ``n_head_kv`` and ``head_dim`` filled in where they are None (not
    stated): KV heads default to the query heads (no GQA) and the head width to
    ``n_embd // n_head``, as llama.cpp and transformers do."""
    return {
        **fields,
        "n_head_kv": fields["n_head_kv"] or fields["n_head"],
        "head_dim": fields["head_dim"] or fields["n_embd"] // fields["n_head"],
    }


#: HF's per-expert projection -> GGUF's stacked tensor (``blk.L.<name>.weight``).
HF_EXPERT_NAMES = {
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
}


def stacked_experts_from_hf(
    c: Any, layer: int, names: Mapping[str, str], hf: Mapping[str, Any], what: str
) -> Iterator[tuple[str, np.ndarray]]:
    """GGUF's stacked expert tensors of ``layer`` (config ``c``: ``n_expert``,
    ``n_ff_exp``) from HF's per-expert ``mlp.experts.E.{proj}.weight`` or transformers 5's
    fused ``mlp.experts.gate_up_proj`` ``(E, 2F, D)`` / ``down_proj`` ``(E, D, F)``;
    ``names`` maps those names to the checkpoint's. A missing expert is refused naming the
    ``what`` checkpoint."""
    p = f"blk.{layer}."
    if "mlp.experts.gate_up_proj" in names:  # gate rows, then up rows
        gate_up = np.asarray(hf[names["mlp.experts.gate_up_proj"]])
        yield p + "ffn_gate_exps.weight", gate_up[:, : c.n_ff_exp]
        yield p + "ffn_up_exps.weight", gate_up[:, c.n_ff_exp :]
        yield p + "ffn_down_exps.weight", np.asarray(hf[names["mlp.experts.down_proj"]])
        return
    for proj, gguf in HF_EXPERT_NAMES.items():
        try:
            parts = [hf[names[f"mlp.experts.{e}.{proj}.weight"]] for e in range(c.n_expert)]
        except KeyError as exc:
            raise ModelFileError(
                f"layer {layer} of this {what} checkpoint lacks expert tensor {exc}; the "
                "checkpoint is incomplete — download it again"
            ) from None
        yield p + gguf + ".weight", np.stack([np.asarray(t) for t in parts])
