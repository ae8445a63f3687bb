"""The ``bert`` architecture: BERT / MiniLM encoders for embeddings and reranking.

Absolute learned positions and token types are added to the token embedding and
layer-normed; each layer is post-LN: attention over the whole sequence (no causal mask,
no KV cache) -> residual -> LayerNorm -> GELU FFN -> residual -> LayerNorm. The model has
no LM head: it only runs in embedding mode (``Context.encode``), returning hidden states
that the core pools. A reranker (``BertForSequenceClassification``) adds the classifier
head GGUF stores as ``cls`` (the pooler's dense + tanh) and ``cls.output``.

GGUF keys and tensor names are the ones llama.cpp's converter writes for ``bert``. HF's
``gelu`` is the exact erf form; it runs as the ``gelu_erf`` op where the backend's probe
says yes, else as the tanh form llama.cpp uses (a difference of about 1e-3 per value).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from tessera.contract.arch import EncoderArchitecture, check_tensors, metadata_key
from tessera.contract.names import (
    ConfigField,
    TensorNames,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
    tensors_from_hf,
)
from tessera.engine.pooling import POOLING_TYPES, pooling_name
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.bert.graph import FUSED_LINEAR_DISABLE, FUSED_QKV, BertGraph

TESSERA_PLUGIN_API = 2

#: ``classifier_activation`` values: applied to rank scores by the embedding engine.
CLASSIFIER_ACTIVATIONS = ("none", "sigmoid", "softmax")
#: sentence-transformers ``activation_fn`` class names -> tessera's names.
_ST_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax"}


@attrs.frozen
class BertConfig:
    """Hyper-parameters of one BERT encoder, in GGUF terms."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_ctx_train: int = 512
    n_token_types: int = 2
    norm_eps: float = 1e-12
    pooling_type: str = attrs.field(default="cls", validator=attrs.validators.in_(POOLING_TYPES))
    #: Classifier labels (reranker / sequence classification); empty: no classifier.
    classifier_labels: tuple[str, ...] = ()
    #: Whether the classifier starts with the pooler's dense + tanh (``cls`` tensors).
    classifier_dense: bool = True
    #: "none", "sigmoid", "softmax", or "" for the engine's default.
    classifier_activation: str = ""
    #: HF ``hidden_act``: "gelu" is exact (erf); "gelu_new" and friends are the tanh form.
    gelu_exact: bool = True

    def __attrs_post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head")
        if self.classifier_activation not in ("", *CLASSIFIER_ACTIVATIONS):
            raise ValueError(f"unknown classifier activation '{self.classifier_activation}'")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# old checkpoints name LayerNorm parameters gamma / beta
_HF_SUFFIXES = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


def _with_suffixes(stems: Mapping[str, str]) -> dict[str, str]:
    return {
        f"{hf}.{s}": f"{gguf}.{t}" for hf, gguf in stems.items() for s, t in _HF_SUFFIXES.items()
    }


HF_NAMES = TensorNames(
    global_names=_with_suffixes(
        {
            "embeddings.word_embeddings": "token_embd",
            "embeddings.position_embeddings": "position_embd",
            "embeddings.token_type_embeddings": "token_types",
            "embeddings.LayerNorm": "token_embd_norm",
            "pooler.dense": "cls",
            "classifier": "cls.output",
            # sentence-transformers Dense modules after pooling (tessera.engine.pooling.dense_out)
            "dense_2_out": "dense_2",
            "dense_3_out": "dense_3",
        }
    ),
    layer_names=_with_suffixes(
        {
            "attention.self.query": "attn_q",
            "attention.self.key": "attn_k",
            "attention.self.value": "attn_v",
            "attention.output.dense": "attn_output",
            "attention.output.LayerNorm": "attn_output_norm",
            "intermediate.dense": "ffn_up",
            "output.dense": "ffn_down",
            "output.LayerNorm": "layer_output_norm",
        }
    ),
    checkpoint="a bert",
    plugin="bert architecture",
    layer_prefix="encoder.layer.",
    prefixes=("bert.",),
    skip_suffixes=("position_ids",),  # a buffer of 0..n_ctx_train-1, not a weight
)
CONFIG_FIELDS = (
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=512),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    ConfigField("norm_eps", "attention.layer_norm_epsilon", "layer_norm_eps", float, 1e-12),
    ConfigField("classifier_activation", "classifier.activation", (), str, "", omit_default=True),
    ConfigField("gelu_exact", "gelu_exact", (), bool, True, omit_default=True),
    # GGUF states these by tensor shapes (see config_from_gguf)
    ConfigField("n_vocab", (), "vocab_size"),
    ConfigField("n_token_types", (), "type_vocab_size", default=2),
)


def _hf_pooling(hf: Mapping[str, Any]) -> str:
    """sentence-transformers' pooling mode (from ``_st_pooling``, see hf_folder), else rank
    for a sequence classifier, else cls (what HF's BertModel pooler reads)."""
    if hf.get("_st_pooling"):
        return str(hf["_st_pooling"])
    if any(a.endswith("ForSequenceClassification") for a in hf.get("architectures") or ()):
        return "rank"
    return "cls"


class BertArchitecture(EncoderArchitecture):
    names = ("bert",)
    hf_model_types = ("bert",)

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> BertConfig:
        labels = tuple(str(x) for x in metadata.get("bert.classifier.output_labels") or ())
        if not labels and "cls.output.weight" in tensor_shapes:
            labels = tuple(f"LABEL_{i}" for i in range(tensor_shapes["cls.output.weight"][0]))
        return BertConfig(
            **fields_from_gguf(CONFIG_FIELDS, metadata, "bert"),
            n_vocab=int(tensor_shapes["token_embd.weight"][0]),
            n_token_types=int(tensor_shapes.get("token_types.weight", (0,))[0]),
            pooling_type=pooling_name(int(metadata_key(metadata, "bert", "pooling_type", 2))),
            classifier_labels=labels,
            classifier_dense="cls.weight" in tensor_shapes,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> BertConfig:
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ModelFileError(
                f"BERT position_embedding_type '{hf['position_embedding_type']}' is not "
                "supported; tessera's bert plugin reads absolute positions only"
            )
        pooling = _hf_pooling(hf)
        labels: tuple[str, ...] = ()
        if pooling == "rank":
            id2label = hf.get("id2label") or {}
            n = int(hf.get("num_labels") or len(id2label) or 1)
            labels = tuple(str(id2label.get(str(i), f"LABEL_{i}")) for i in range(n))
        activation_fn = str((hf.get("sentence_transformers") or {}).get("activation_fn", ""))
        return BertConfig(
            **fields_from_hf(CONFIG_FIELDS, hf),
            pooling_type=pooling,
            classifier_labels=labels,
            classifier_activation=_ST_ACTIVATIONS.get(activation_fn.rsplit(".", 1)[-1], ""),
            gelu_exact=hf.get("hidden_act", "gelu") == "gelu",
        )

    def gguf_metadata(self, c: BertConfig) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "general.architecture": "bert",
            **fields_to_gguf(CONFIG_FIELDS, c, "bert"),
            "bert.attention.causal": False,
            "bert.pooling_type": POOLING_TYPES.index(c.pooling_type),
        }
        if c.classifier_labels:
            meta["bert.classifier.output_labels"] = list(c.classifier_labels)
        return meta

    def tensor_shapes(self, c: BertConfig) -> dict[str, tuple[int, ...]]:
        d = c.n_embd
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (c.n_vocab, d),
            "position_embd.weight": (c.n_ctx_train, d),
            "token_embd_norm.weight": (d,),
            "token_embd_norm.bias": (d,),
        }
        if c.n_token_types:
            shapes["token_types.weight"] = (c.n_token_types, d)
        for i in range(c.n_layer):
            p = f"blk.{i}."
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                shapes[p + name + ".weight"] = (d, d)
                shapes[p + name + ".bias"] = (d,)
            shapes[p + "ffn_up.weight"] = (c.n_ff, d)
            shapes[p + "ffn_up.bias"] = (c.n_ff,)
            shapes[p + "ffn_down.weight"] = (d, c.n_ff)
            shapes[p + "ffn_down.bias"] = (d,)
            for norm in ("attn_output_norm", "layer_output_norm"):
                shapes[p + norm + ".weight"] = (d,)
                shapes[p + norm + ".bias"] = (d,)
        if c.classifier_labels:
            if c.classifier_dense:
                shapes["cls.weight"] = (d, d)
                shapes["cls.bias"] = (d,)
            shapes["cls.output.weight"] = (len(c.classifier_labels), d)
            shapes["cls.output.bias"] = (len(c.classifier_labels),)
        return shapes

    def tensors_from_hf(
        self, c: BertConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        # BertModel's pooler is unused for embeddings (llama.cpp drops it too)
        skip = () if c.classifier_labels else ("pooler.",)
        return tensors_from_hf(HF_NAMES, c, hf_tensors, for_gguf, skip=skip)

    def example_config(self, **overrides: Any) -> BertConfig:
        overrides.pop("arch", None)
        overrides.pop("n_head_kv", None)  # no GQA in BERT
        fields = {
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_ff": 128,
            "n_head": 4,
            "n_ctx_train": 128,
            "pooling_type": "mean",
        } | overrides
        return BertConfig(**fields)

    def required_ops(self, c: BertConfig) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("layer_norm", {"n": c.n_embd}),
            ("attention", {"n_head": c.n_head, "n_head_kv": c.n_head, "head_dim": c.head_dim}),
            ("gelu", {}),
        ]

    def build(self, c: BertConfig, weights: Mapping[str, Any], backend: Any) -> BertGraph:
        check_tensors("bert", self.tensor_shapes(c), weights)
        return BertGraph(c, weights, backend)


@hookimpl
def tessera_register_architectures(register):
    register(BertArchitecture())


@hookimpl
def tessera_register_switches(register):
    register(FUSED_LINEAR_DISABLE)
    register(FUSED_QKV)
