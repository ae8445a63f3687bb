"""The facts ``tessera quantize`` needs about llama.cpp's file types and tensors, as data.

llama-quantize's file types (``llama_ftype``: the name on its command line, the number it
writes to ``general.file_type``, the GGML type most tensors get), the block size of each
GGML type, the fallback for a row that does not fill a type's blocks, and which tensors it
never quantizes and how it sorts tensors into categories (``src/llama-quant.cpp``).
"""

from __future__ import annotations

import attrs

from tessera.errors import TesseraError


@attrs.frozen
class FileType:
    """One ``TYPE`` argument of ``tessera quantize``."""

    name: str
    #: ``general.file_type`` (llama.cpp's ``llama_ftype``; tessera's own above 199).
    number: int
    #: The GGML type a tensor gets before the mix and the fallback.
    default: str
    #: Whether llama.cpp's per-tensor mix applies: only when ``default`` is quantized
    #: (``ggml_is_quantized``); F32/F16/BF16 (and tessera's FP8) give every tensor it.
    mixed: bool = True


FILE_TYPES: dict[str, FileType] = {
    f.name: f
    for f in (
        FileType("F32", 0, "F32", mixed=False),
        FileType("F16", 1, "F16", mixed=False),
        FileType("Q4_0", 2, "Q4_0"),
        FileType("Q4_1", 3, "Q4_1"),
        FileType("Q8_0", 7, "Q8_0"),
        FileType("Q5_0", 8, "Q5_0"),
        FileType("Q5_1", 9, "Q5_1"),
        FileType("Q2_K", 10, "Q2_K"),
        FileType("Q3_K_S", 11, "Q3_K"),
        FileType("Q3_K_M", 12, "Q3_K"),
        FileType("Q3_K_L", 13, "Q3_K"),
        FileType("Q4_K_S", 14, "Q4_K"),
        FileType("Q4_K_M", 15, "Q4_K"),
        FileType("Q5_K_S", 16, "Q5_K"),
        FileType("Q5_K_M", 17, "Q5_K"),
        FileType("Q6_K", 18, "Q6_K"),
        FileType("IQ4_NL", 25, "IQ4_NL"),
        FileType("IQ4_XS", 30, "IQ4_XS"),
        FileType("BF16", 32, "BF16", mixed=False),
        FileType("TQ1_0", 36, "TQ1_0"),
        FileType("TQ2_0", 37, "TQ2_0"),
        # experts MXFP4, every other quantized tensor Q8_0 (no other mix rule)
        FileType("MXFP4_MOE", 38, "MXFP4"),
        # tessera's: no llama.cpp number; every quantized tensor FP8, the head included
        FileType("FP8_E4M3", 200, "FP8_E4M3", mixed=False),
    )
}
#: llama-quantize's aliases (its QUANT_OPTIONS): the bare K name is the _M mix.
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def file_type(name: str) -> FileType:
    """The file type called ``name`` (case-insensitive, aliases included), or a clear error."""
    key = name.upper()
    key = ALIASES.get(key, key)
    if key not in FILE_TYPES:
        choices = ", ".join([*FILE_TYPES, *ALIASES])
        raise TesseraError(f"unknown quant type '{name}'; choose one of: {choices}")
    return FILE_TYPES[key]


#: Values per block of each GGML type (ggml's ``blck_size``); 1 for the float types.
BLOCK_SIZE = {
    "F32": 1, "F16": 1, "BF16": 1, "FP8_E4M3": 1,
    "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32, "MXFP4": 32,
    "NVFP4": 64,
    "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256,
    "TQ1_0": 256, "TQ2_0": 256,
}  # fmt: skip
#: ``tensor_type_fallback``: the type a tensor gets when its rows do not fill the wanted
#: type's blocks. A 32-block type keeps itself (and then falls to F16 like any other).
FALLBACK = {
    "IQ4_XS": "IQ4_NL",  # 256-block IQ types -> the 32-block IQ4_NL
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "TQ1_0": "Q4_0",
    "TQ2_0": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}
#: What a row that fits neither the type nor its fallback gets ("must use F16").
LAST_RESORT = "F16"


def fitting_type(wanted: str, n_cols: int) -> str:
    """``wanted``, or llama.cpp's fallback for rows of ``n_cols`` values that do not fill
    its blocks; an error where llama-quantize has no fallback (NVFP4's 64-blocks)."""
    if n_cols % BLOCK_SIZE[wanted] == 0:
        return wanted
    if wanted not in FALLBACK and BLOCK_SIZE[wanted] > 32:
        raise TesseraError(
            f"rows of {n_cols} values do not fill {wanted}'s blocks of {BLOCK_SIZE[wanted]} "
            "and llama.cpp defines no fallback for it"
        )
    fallback = FALLBACK.get(wanted, wanted)
    return fallback if n_cols % BLOCK_SIZE[fallback] == 0 else LAST_RESORT


# -- which tensors are quantized (tensor_allows_quantization) -------------------------------

#: A name containing one of these is never quantized.
NOT_QUANTIZED_PARTS = (
    "_norm.weight",
    "ffn_gate_inp.weight",  # MoE routers
    "ffn_gate_tid2eid.weight",  # a token -> expert table of integers (DeepSeek-V4)
    "altup",  # Gemma 3n: tiny (4x4)
    "laurel",
    "per_layer_model_proj",  # Gemma 3n: small enough to keep
    "ssm_conv1d",  # Mamba's small conv1d
    "shortconv.conv.weight",
    "indexer.k_proj.weight",  # tiny indexer projections
    "indexer.q_proj.weight",
    *(
        f"time_mix_{n}.weight"  # RWKV's small 2-D weights
        for n in (
            "first",
            "w0",
            "w1",
            "w2",
            "v0",
            "v1",
            "v2",
            "a0",
            "a1",
            "a2",
            "g1",
            "g2",
            "decay_w1",
            "decay_w2",
            "lerp_fused",
        )
    ),  # fmt: skip
    "attn_rel_b.weight",  # T5's relative position bias
    ".position_embd",  # multimodal encoders
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",  # audio codebooks
    "mm.a.code_embd",
)
#: Whole names never quantized: positional embeddings and token types (BERT).
NOT_QUANTIZED_NAMES = ("position_embd.weight", "token_types.weight")
#: Further parts for one architecture.
NOT_QUANTIZED_BY_ARCH = {
    "glm5-next": (
        "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
        "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
        "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
        "attn_v_b.weight",
    ),
}  # fmt: skip


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml's ``ggml_n_dims``: outer dimensions of size 1 do not count, so a (1, n)
    tensor is 1-D (shapes in numpy order, outermost first)."""
    dims = len(shape)
    while dims > 1 and shape[len(shape) - dims] == 1:
        dims -= 1
    return dims


def allows_quantization(name: str, shape: tuple[int, ...], arch: str) -> bool:
    """Whether llama-quantize may change this tensor's type at all; if not, it is copied."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    parts = NOT_QUANTIZED_PARTS + NOT_QUANTIZED_BY_ARCH.get(arch, ())
    return name not in NOT_QUANTIZED_NAMES and not any(p in name for p in parts)


# -- categories (tensor_get_category): the first match wins --------------------------------

OUTPUT, TOKEN_EMBD, ATTN_V, ATTN_K, ATTN_Q = "output", "token_embd", "attn_v", "attn_k", "attn_q"
ATTN_OUTPUT, FFN_UP, FFN_GATE, FFN_DOWN, OTHER = "attn_output", "ffn_up", "ffn_gate", "ffn_down", ""
EXACT_CATEGORIES = {
    "output.weight": OUTPUT,
    "token_embd.weight": TOKEN_EMBD,
    "per_layer_token_embd.weight": TOKEN_EMBD,
}
#: Substring -> category. attn_qkv and attn_kv_b count as attn_v: llama.cpp gives every
#: "attn_v-like" tensor the attn_v rules (its separate attn_qkv branch is never reached).
PART_CATEGORIES = (
    ("attn_qkv.weight", ATTN_V),
    ("attn_kv_b.weight", ATTN_V),
    ("attn_v.weight", ATTN_V),
    ("attn_k.weight", ATTN_K),
    ("attn_q.weight", ATTN_Q),
    ("attn_output.weight", ATTN_OUTPUT),
    ("ffn_up", FFN_UP),
    ("ffn_gate", FFN_GATE),
    ("ffn_down", FFN_DOWN),
)


def category(name: str) -> str:
    if name in EXACT_CATEGORIES:
        return EXACT_CATEGORIES[name]
    return next((c for part, c in PART_CATEGORIES if part in name), OTHER)
