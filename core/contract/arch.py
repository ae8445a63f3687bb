"""The architecture contract: how a model family maps file metadata and tensors onto a
forward pass built from backend ops.

An architecture plugin registers one :class:`Architecture` instance. The core uses it to
read a config from GGUF metadata or a Hugging Face ``config.json``, to learn the KV-cache
layout, and to build a :class:`ModelGraph` over loaded weights. Converters and the
test-model maker use the reverse direction (config -> metadata, HF names -> GGUF names).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import attrs
import numpy as np

from tessera.errors import ModelFileError


def metadata_key(metadata: Mapping[str, Any], arch: str, name: str, default: Any = None) -> Any:
    """GGUF key ``{arch}.{name}``, else ``default``; a required key (no default) that is
    missing is one clear error, not a KeyError deep in a config."""
    value = metadata.get(f"{arch}.{name}", default)
    if value is None:
        raise ModelFileError(
            f"the GGUF metadata lacks '{arch}.{name}', which a {arch} model needs; the file "
            "is incomplete — convert the model again"
        )
    return value


def check_tensors(arch: str, needed: Iterable[str], weights: Mapping[str, Any]) -> None:
    """Refuse to build a graph when a tensor the architecture needs was not loaded."""
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ModelFileError(
            f"the model lacks tensor '{missing[0]}' (and {len(missing) - 1} more) that a "
            f"{arch} model needs; the file is incomplete — convert it again"
        )


@attrs.frozen
class KVLayerLayout:
    """Shape of one layer's K and V cache rows: ``n_head_kv`` heads of ``head_dim_k/v``."""

    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    #: V is no tensor of its own but the first ``head_dim_v`` values of each K row: an
    #: MLA layer caches one compressed latent (plus its RoPE part) that serves as both,
    #: as llama.cpp caches K alone for it. The cache holds K only.
    v_in_k: bool = False


@attrs.frozen
class RecurrentLayerLayout:
    """The state one recurrent layer keeps per sequence instead of KV rows (llama.cpp's
    ``r`` and ``s`` tensors): a causal conv's last inputs and the recurrence's memory."""

    conv_shape: tuple[int, ...]
    state_shape: tuple[int, ...]


@attrs.frozen
class ForwardInput:
    """One ubatch as the graph sees it.

    ``tokens``, ``positions`` are int32 ``(T,)``; ``output_rows`` are the row indices
    (ascending) whose logits are wanted. ``kv`` gives per-layer cache storage, the cells
    this ubatch writes and the attention mask over cached cells.
    """

    tokens: np.ndarray
    positions: np.ndarray
    output_rows: np.ndarray
    kv: Any
    #: Embedding mode (``Context.encode``): return the final hidden states (after the
    #: output norm) of ``output_rows``, shape ``(len(output_rows), n_embd)``; the LM head
    #: is never computed. Anything that only helps generation (prefill pruning) is off.
    embeddings: bool = False
    #: int32 ``(T,)`` sequence of each row; encoders (no KV cache) mask attention with it.
    seq_ids: np.ndarray | None = None
    #: int32 ``(T,)`` BERT segment (token type) of each row; None means all 0.
    token_types: np.ndarray | None = None
    #: The context allows prefill pruning (see :func:`tessera.engine.context.choose_prune`): one
    #: sequence, no embeddings, no intermediate-layer outputs, unified KV, not switched
    #: off. An architecture with KV-shared layers may then run those layers on the
    #: ``output_rows`` alone; with False it must compute every row through every layer.
    prune_ok: bool = False
    #: The recurrent layers' per-sequence state for this ubatch (a
    #: :class:`tessera.engine.recurrent.RecurrentView`), None for a model without them.
    recurrent: Any = None


class ModelGraph(Protocol):
    """A built model: turns a ubatch into logits for its output rows."""

    def forward(self, inp: ForwardInput) -> Any:
        """Return backend logits of shape ``(len(inp.output_rows), n_vocab)``, or with
        ``inp.embeddings`` the hidden states ``(len(inp.output_rows), n_embd)``."""


class Architecture(ABC):
    """Base class of architecture plugins."""

    #: GGUF ``general.architecture`` values this plugin loads, e.g. ``("llama", "qwen2")``.
    names: tuple[str, ...] = ()
    #: Hugging Face ``config.json`` ``model_type`` values it loads.
    hf_model_types: tuple[str, ...] = ()
    #: ``config.json`` ``architectures`` class names it loads, looked up before
    #: ``model_type`` (as llama.cpp's converter picks by class): one ``model_type`` can name
    #: two models, e.g. ``gemma3_text`` a language model (``Gemma3ForCausalLM``) and an
    #: encoder (``Gemma3TextModel``).
    hf_classes: tuple[str, ...] = ()

    @abstractmethod
    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> Any:
        """Read the model config from GGUF metadata (``general.architecture`` included).

        ``tensor_shapes`` maps the file's tensor names to numpy-order shapes, for facts
        GGUF states only by a tensor's presence or size (e.g. tied embeddings).
        """

    @abstractmethod
    def config_from_hf(self, hf_config: Mapping[str, Any]) -> Any:
        """Read the model config from a Hugging Face ``config.json`` dict."""

    @abstractmethod
    def gguf_metadata(self, config: Any) -> dict[str, Any]:
        """GGUF metadata for ``config`` (architecture keys, not tokenizer keys)."""

    @abstractmethod
    def tensor_shapes(self, config: Any) -> dict[str, tuple[int, ...]]:
        """Every GGUF tensor name of the model and its numpy-order shape."""

    @abstractmethod
    def tensors_from_hf(
        self, config: Any, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        """Rename (and where the GGUF layout needs it, permute) HF tensors to GGUF names.

        ``hf_tensors`` maps HF names to lazily-read arrays (numpy, 2-D ``(out, in)``).
        ``for_gguf`` is True when writing a GGUF file that llama.cpp must read the same way
        (e.g. the ``llama`` arch's Q/K row permutation); False when the runtime loads the
        HF folder directly with a config that already accounts for the layout.
        """

    @abstractmethod
    def kv_layout(self, config: Any) -> list[KVLayerLayout | None]:
        """Per layer: the K/V row shape it caches, or None for a layer that owns no KV."""

    @abstractmethod
    def build(self, config: Any, weights: Mapping[str, Any], backend: Any) -> ModelGraph:
        """Build the forward pass over loaded weights (GGUF names) on ``backend``."""

    def example_config(self, **overrides: Any) -> Any:
        """A small valid config for test models (``tessera.testing.models.make_gguf``).

        Accepts ``arch`` (which of :attr:`names` to make, default the first), at least the
        generic sizes ``n_vocab``, ``n_embd``, ``n_layer``, ``n_head``, ``n_head_kv`` and
        ``n_ff``, and any field of the architecture's own config; what is not given takes
        a small default. An architecture that cannot make test models
        leaves this unimplemented.
        """
        # Optional part of the contract: only the test-model maker needs it, so a plugin
        # that never makes test models is still a complete architecture.
        raise NotImplementedError(
            f"architecture plugin {type(self).__name__} does not implement example_config(), "
            "so tessera.testing cannot make test models for it; add the method to the plugin"
        )

    def required_ops(self, config: Any) -> list[tuple[str, dict[str, Any]]]:
        """The ops the forward pass calls, with the parameters it calls them with.

        The loader asks the backend's ``supports(Op(op, params, dtype))`` for each before it loads
        any weight, so an unsupported combination is found up front (and, when no backend
        was named, another backend is chosen). The default lists every core op without
        parameters; architectures override it with their real shapes.
        """
        from tessera.contract.backend import CORE_OPS

        return [(op, {}) for op in CORE_OPS]

    def n_vocab(self, config: Any) -> int:
        """Vocabulary size (rows of the output head)."""
        return int(config.n_vocab)

    def recurrent_layout(self, config: Any) -> list[RecurrentLayerLayout | None]:
        """Per layer: the state it keeps per sequence, or None; an empty list (the default)
        for a model without recurrent layers. The context owns the states beside the KV
        cache and moves them with its sequence operations."""
        return []

    def expert_layout(self, config: Any) -> Any:
        """A mixture-of-experts model's :class:`tessera.contract.experts.ExpertLayout`, else None.

        When it is not None, the loader does not load the stacked expert tensors it names;
        it calls ``build(config, weights, backend, experts=...)`` with a
        :class:`tessera.contract.experts.ModelExperts` instead, whose ``layer(il)`` gives the
        :class:`tessera.contract.experts.ExpertWeights` for the backend's ``moe_ffn`` op (placed
        per ``--cpu-moe`` / ``-ncmoe``, served by the expert cache). The default: None.
        """
        return None

    def variant(self, config: Any) -> Architecture:
        """The architecture object that runs ``config``; the default is this one.

        For a GGUF name that covers a layout another plugin's code runs: llama.cpp writes
        Mixtral as ``llama`` with routed experts, so the llama plugin's
        ``config_from_gguf`` returns an MoE config and this method the MoE architecture.
        The loader calls it right after ``config_from_gguf`` / ``config_from_hf`` and uses
        its answer for everything else (``expert_layout``, ``build``, ``required_ops`` ...).
        """
        return self

    def causal_attention(self, config: Any) -> bool:
        """False for encoders (BERT): each token attends to its whole sequence, no KV cache
        is kept and the model only embeds (``Context.encode``). The default is a decoder."""
        return True

    def pooling_type(self, config: Any) -> str:
        """The pooling the model was trained with (GGUF ``{arch}.pooling_type``): one of
        ``none``, ``mean``, ``cls``, ``last``, ``rank``. The default is ``none``."""
        return "none"

    def example_tensors(self, config: Any) -> dict[str, np.ndarray]:
        """Tensors of a test model whose values are not free random weights (RoPE factors,
        scalars that must stay near 1), by GGUF name; ``make_gguf`` writes them instead of
        random values. The default has none."""
        return {}

    def tensor_parallel(
        self, config: Any, rank: int, world_size: int, *, split_lm_head: bool = True
    ) -> Any:
        """Rank ``rank`` of ``world_size``'s part of the model, as a
        :class:`tessera.contract.tp.TensorParallelPlan`, or None when the architecture
        cannot be split (the default). Raise :class:`tessera.errors.TesseraError` when this
        config cannot be split ``world_size`` ways (heads that do not divide)."""
        return None


class EncoderArchitecture(Architecture):
    """Base of encoder-only architectures (BERT, EmbeddingGemma): bidirectional attention
    over whole inputs, no KV cache, and the pooling stored in the config's
    ``pooling_type``; subclasses implement the rest of :class:`Architecture`."""

    def kv_layout(self, config: Any) -> list[KVLayerLayout | None]:
        return [None] * config.n_layer  # an encoder keeps no KV cache

    def causal_attention(self, config: Any) -> bool:
        return False

    def pooling_type(self, config: Any) -> str:
        return config.pooling_type


#: The generic model dimensions (GGUF-side names) and their names in HF ``config.json``.
HF_DIM_NAMES = {
    "n_vocab": "vocab_size",
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_ff": "intermediate_size",
    "n_head": "num_attention_heads",
    "n_head_kv": "num_key_value_heads",
    "head_dim": "head_dim",
}


def dims_from_hf(hf: Mapping[str, Any]) -> dict[str, int]:
    """The generic dimensions of an HF ``config.json``: KV heads default to the query
    heads (no GQA) and the head width to hidden size / heads, as transformers does."""
    n_head = int(hf["num_attention_heads"])
    return {
        "n_vocab": int(hf["vocab_size"]),
        "n_embd": int(hf["hidden_size"]),
        "n_layer": int(hf["num_hidden_layers"]),
        "n_ff": int(hf["intermediate_size"]),
        "n_head": n_head,
        "n_head_kv": int(hf.get("num_key_value_heads") or n_head),
        "head_dim": int(hf.get("head_dim") or hf["hidden_size"] // n_head),
    }


def hf_dims(dims: Mapping[str, Any]) -> dict[str, Any]:
    """The HF ``config.json`` fields of those of ``dims`` that have one (others ignored)."""
    return {HF_DIM_NAMES[name]: value for name, value in dims.items() if name in HF_DIM_NAMES}
