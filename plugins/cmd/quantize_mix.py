"""llama-quantize's choice of each tensor's type for a file type (its "mix"), as a pure
function: names, shapes, stored types and metadata in, a type name per tensor out.

It follows ``llama_tensor_get_type`` of llama.cpp's ``src/llama-quant.cpp`` without an
importance matrix or per-tensor overrides: tensors it never quantizes keep their stored
type; the output head (and the token embeddings when they are tied to it) gets Q6_K or
Q8_0; then the rules of the file type's table (:data:`MIXES`) for attn_v, ffn_down,
attn_output and the token embeddings; then the fallback for rows that do not fill the
type's blocks. Its per-layer rules count tensors in llama.cpp's order (by layer, then by
name), so the choice does not depend on the order of the tensors in the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from tessera.errors import TesseraError
from tessera.plugins.cmd.quantize_types import (
    ATTN_K,
    ATTN_OUTPUT,
    ATTN_V,
    BLOCK_SIZE,
    FFN_DOWN,
    FFN_GATE,
    FFN_UP,
    OUTPUT,
    TOKEN_EMBD,
    FileType,
    allows_quantization,
    category,
    fitting_type,
)

#: llama.cpp's LLM_TYPE_70B, the one model size a rule asks about: arch -> its layer count.
SEVENTY_B_LAYERS = {"llama": 80, "qwen2": 80, "olmo": 80, "deci": 80, "jais2": 68}
_LAYER = re.compile(r"blk\.(\d+)\.")


@attrs.frozen
class Model:
    """The hyperparameters the rules read."""

    arch: str
    n_layer: int
    #: n_head / n_head_kv (integer division; 0 without KV heads).
    n_gqa: int
    n_expert: int
    #: llama.cpp's "70B" size (its attn_v gets Q5_K for Q3_K and Q4_K).
    seventy_b: bool

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Model:
        arch = str(metadata["general.architecture"])

        def first(key: str, default: int) -> int:
            value = metadata.get(f"{arch}.{key}", default)
            per_layer = isinstance(value, (list, tuple)) or getattr(value, "ndim", 0)
            return int(value[0] if per_layer else value)  # llama.cpp asks layer 0

        n_layer = first("block_count", 0)
        n_head = first("attention.head_count", 0)
        n_head_kv = first("attention.head_count_kv", n_head)
        n_expert = first("expert_count", 0)
        seventy_b = n_layer == SEVENTY_B_LAYERS.get(arch)
        if arch == "llama":  # 80 layers of one KV head per head is the 65B; 8 experts Mixtral
            seventy_b = seventy_b and n_head != n_head_kv and n_expert != 8
        n_gqa = n_head // n_head_kv if n_head_kv else 0
        return cls(arch, n_layer, n_gqa, n_expert, seventy_b)

    @property
    def falcon(self) -> bool:
        return self.arch == "falcon"


@attrs.frozen
class Where:
    """Where a tensor sits for a rule: ``i`` of ``n`` (the layer of an ffn_down; for an
    attn_v, how many attn_v-like tensors came before it, of how many)."""

    i: int
    n: int
    model: Model


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers that get more bits in the _M mixes: the first and last eighth
    and every third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


#: A rule returns the tensor's type, or None to keep the file type's default.
Rule = Callable[[Where], str | None]


def _attn_output(other: str | None, falcon: str | None = None, experts8: bool = True) -> Rule:
    """attn_output: ``falcon`` for falcon; Q5_K with 8 experts (for the file types that
    llama.cpp lists there); ``other`` otherwise."""

    def rule(w: Where) -> str | None:
        if w.model.falcon:
            return falcon
        if w.model.n_expert == 8:
            return "Q5_K" if experts8 else None
        return other

    return rule


def _q3_k_m_ffn_down(w: Where) -> str:
    if w.i < w.n // 16:
        return "Q5_K"
    return "Q4_K" if not w.model.falcon or use_more_bits(w.i, w.n) else "Q3_K"


def _q4_k_m_ffn_down(w: Where) -> str | None:
    if w.model.falcon:
        return "Q6_K" if w.i < w.n // 16 else "Q5_K" if use_more_bits(w.i, w.n) else "Q4_K"
    return "Q6_K" if use_more_bits(w.i, w.n) else None


def _more_bits(qtype: str) -> Rule:
    return lambda w: qtype if use_more_bits(w.i, w.n) else None


_IQ4 = {  # IQ4_NL and IQ4_XS, without an importance matrix
    ATTN_V: lambda w: "Q5_K" if w.model.n_gqa >= 4 else None,
    FFN_DOWN: lambda w: "Q5_K" if w.i < w.n // 8 else None,
    ATTN_OUTPUT: _attn_output(None),
}
_TERNARY = {TOKEN_EMBD: lambda w: "Q4_K"}  # untied token embeddings of TQ1_0 / TQ2_0

#: file type -> category -> rule (llama_tensor_get_type_impl's branches, by file type).
MIXES: dict[str, dict[str, Rule]] = {
    "Q2_K": {
        ATTN_V: lambda w: "Q4_K" if w.model.n_gqa >= 4 else "Q3_K",
        FFN_DOWN: lambda w: "Q3_K",
        ATTN_OUTPUT: _attn_output("Q3_K"),
    },
    "Q3_K_S": {ATTN_OUTPUT: _attn_output(None)},
    "Q3_K_M": {
        ATTN_V: lambda w: "Q5_K" if w.i < 2 else "Q4_K",
        FFN_DOWN: _q3_k_m_ffn_down,
        ATTN_OUTPUT: _attn_output("Q4_K"),
    },
    "Q3_K_L": {
        ATTN_V: lambda w: "Q5_K",
        FFN_DOWN: lambda w: "Q4_K" if w.model.falcon else "Q5_K",
        ATTN_OUTPUT: _attn_output("Q5_K", falcon="Q4_K", experts8=False),
    },
    "Q4_K_S": {
        ATTN_V: lambda w: "Q5_K" if w.i < 4 else None,
        FFN_DOWN: lambda w: "Q5_K" if not w.model.falcon and w.i < w.n // 8 else None,
        ATTN_OUTPUT: _attn_output(None),
    },
    "Q4_K_M": {
        ATTN_V: _more_bits("Q6_K"),
        FFN_DOWN: _q4_k_m_ffn_down,
        ATTN_OUTPUT: _attn_output(None),
    },
    "Q5_K_M": {ATTN_V: _more_bits("Q6_K"), FFN_DOWN: _more_bits("Q6_K")},
    "IQ4_NL": _IQ4,
    "IQ4_XS": _IQ4,
    "TQ1_0": _TERNARY,
    "TQ2_0": _TERNARY,
}


@attrs.frozen
class Mix:
    """The type name of every tensor, and the tensors that got a fallback type."""

    types: dict[str, str]
    fallbacks: list[str]


def llama_order(name: str) -> tuple[int, str]:
    """llama.cpp's order of tensors: by layer (``blk.N.``; others first), then by name."""
    m = _LAYER.match(name)
    return (int(m[1]) if m else -1, name)


def choose_types(
    tensors: Sequence[tuple[str, tuple[int, ...], str]],
    metadata: Mapping[str, Any],
    ftype: FileType,
    *,
    pure: bool = False,
) -> Mix:
    """The type llama-quantize gives each of ``tensors`` ((name, numpy shape, stored type
    name) triples) for ``ftype``; ``pure`` is its ``--pure`` (no mix, fallbacks still)."""
    model = Model.from_metadata(metadata)
    names = [name for name, _, _ in tensors]
    n_attn_v = sum(category(n) == ATTN_V for n in names)
    walk = _Walk(model, ftype, tied="output.weight" not in names, n_attn_v=n_attn_v)
    types: dict[str, str] = {}
    fallbacks: list[str] = []
    for name, shape, stored in sorted(tensors, key=lambda t: llama_order(t[0])):
        if not allows_quantization(name, shape, model.arch):
            types[name] = stored
        elif not ftype.mixed:
            types[name] = ftype.default
        else:
            wanted = ftype.default if pure else walk.mixed(name, shape)
            types[name] = fitting_type(wanted, shape[-1])
            if types[name] != wanted:
                fallbacks.append(name)
    return Mix({name: types[name] for name in names}, fallbacks)


@attrs.define
class _Walk:
    """The mix of one file, tensor by tensor in llama.cpp's order, with its counters."""

    model: Model
    ftype: FileType
    tied: bool
    n_attn_v: int = 0
    i_attn_v: int = 0
    i_ffn_down: int = 0

    def mixed(self, name: str, shape: tuple[int, ...]) -> str:
        ftype, model, cat = self.ftype, self.model, category(name)
        if cat == OUTPUT or (self.tied and cat == TOKEN_EMBD):
            return self.head(shape[-1])
        if ftype.name == "MXFP4_MOE":
            # stacked experts (a third dimension above 1) MXFP4, all else Q8_0; bailingmoe3
            # has other 3-D tensors, so there the FFN roles are asked for too
            experts = len(shape) >= 3 and shape[-3] > 1
            if model.arch == "bailingmoe3":
                experts = experts and cat in (FFN_UP, FFN_GATE, FFN_DOWN)
            return "MXFP4" if experts else "Q8_0"
        rules = MIXES.get(ftype.name, {})
        chosen = ftype.default
        if cat == ATTN_V:
            chosen = self._rule(rules, cat, Where(self.i_attn_v, self.n_attn_v, model))
            self.i_attn_v += 1
            # 70B: attn_v is 8x smaller than attn_q, so more bits cost little
            if model.seventy_b and chosen in ("Q3_K", "Q4_K"):
                chosen = "Q5_K"
            if model.n_expert == 8:  # costs ~128 MB on Mixtral-8x7B
                chosen = "Q8_0"
        elif cat == ATTN_K and model.n_expert == 8:
            chosen = "Q8_0"
        elif cat == FFN_DOWN:
            chosen = self._rule(rules, cat, Where(self._ffn_down_layer(name), model.n_layer, model))
            self.i_ffn_down += 1
        elif cat in (ATTN_OUTPUT, TOKEN_EMBD):
            chosen = self._rule(rules, cat, Where(0, 0, model))
        return chosen

    def _rule(self, rules: Mapping[str, Rule], cat: str, where: Where) -> str:
        rule = rules.get(cat)
        return (rule(where) if rule else None) or self.ftype.default

    def head(self, n_cols: int) -> str:
        """The output head: Q8_0 for falcon, MXFP4_MOE and rows the file type's blocks do
        not fill; else Q6_K unless the file type is Q8_0 already."""
        default = self.ftype.default
        if self.ftype.name == "MXFP4_MOE" or self.model.falcon:
            return "Q8_0"
        if n_cols % BLOCK_SIZE[default]:
            return "Q8_0"
        return default if default == "Q8_0" else "Q6_K"

    def _ffn_down_layer(self, name: str) -> int:
        """The layer an ffn_down rule sees: with experts, the one in its name (Mixtral's
        expert tensors are not in layer order); else the count of ffn_down tensors so far."""
        if max(1, self.model.n_expert) == 1:
            return self.i_ffn_down
        m = _LAYER.match(name)
        if not m or int(m[1]) >= self.model.n_layer:
            raise TesseraError(
                f"tensor '{name}' names no layer below block_count {self.model.n_layer}; "
                "llama-quantize cannot place it either"
            )
        return int(m[1])
