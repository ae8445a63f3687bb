"""The torch backend's :data:`~tessera.contract.fusion.LLAMA_DECODER` block fusion: a whole
llama-family block per decode token in one native call
(:mod:`tessera.backends.native.kernels`, ``tsr_block_decode``).

Op by op, a decode token crosses from Python into torch or C about 13 times per layer;
each crossing costs tens of microseconds next to matmuls that read a few hundred KiB,
so at two threads the Python side took as long as the matmuls. The native block runs the
same kernels in the same order (native RMSNorm, Q/K/V in one ``matmul_n``, RoPE, the K/V
write, row-list attention, the output projection, the residual, gate/up, SwiGLU, down),
with the same roundings, without returning to Python in between.

It declines (returns None, nothing written) unless every matrix runs a native kernel at
one row (Q/K/V and gate/up of one type or not), the biases are in the activation dtype
(float32 copies where activations are float32), the caches are whole (in the activation
dtype or a ``-ctk`` / ``-ctv`` type, which the block rounds the token's K and V into), and
the token attends to one list of rows with nothing masked (no sliding window).
``TESSERA_NATIVE_DISABLE=1`` turns it off with the other native kernels;
``TESSERA_DECODER_BLOCK_DISABLE=1`` (:data:`DECODER_BLOCK_DISABLE`) turns off only this
fusion (the ops run one by one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.backends.native.attention_kv import KV_TYPE_CODES
from tessera.backends.native.kernels import BLOCK_GGML_TYPES, BlockStruct, StepStruct
from tessera.backends.torch.activations import to_dtype
from tessera.switches import OFF, Choice, Switch, choose

DECODER_BLOCK_DISABLE = Switch(
    "TESSERA_DECODER_BLOCK_DISABLE",
    "decode runs a llama-family block op by op instead of in one native call",
    OFF,
)


def choose_block(backend: Any) -> Choice:
    """Whether the fusion serves ``backend``: the switch, then the native kernels;
    recorded as its ``"decoder block"`` path."""

    def probe() -> tuple[bool, str]:
        if backend._native() is None:
            return False, f"no native kernels ({backend.probe_cache['native'].reason})"
        if backend._native().portable:  # the block's C code calls the vector kernels
            return False, "TESSERA_NATIVE_PATH=portable: the layer's matmuls op by op"
        return True, "native kernels: one call per block and decode token"

    choice = choose(DECODER_BLOCK_DISABLE, probe, on="one native call", off="op by op")
    return backend.record_path("decoder block", choice)


def decoder_block(
    backend: Any,
    x: Any,
    block: Any,
    k_cache: Any,
    v_cache: Any,
    cell: int,
    kv_rows: Any,
    positions: np.ndarray,
) -> Any | None:
    """The block's output, or None with nothing written (see
    :data:`tessera.contract.fusion.LLAMA_DECODER`)."""
    native = backend._native()
    if native is None or x.shape[0] != 1 or not x.is_contiguous():
        return None
    struct = _block_struct(backend, block)
    if struct is None or not _caches_ok(k_cache, v_cache, block):
        return None
    step = _step_struct(backend, kv_rows, block, positions, cell)
    if step is None:
        return None
    from tessera.backends.torch.kv_store import Q8_0Rows, cache_type_of  # torch: not at import

    k, v = (c.blocks if isinstance(c, Q8_0Rows) else c for c in (k_cache, v_cache))
    struct.k_cache, struct.v_cache = k.data_ptr(), v.data_ptr()
    struct.k_type, struct.v_type = (KV_TYPE_CODES[cache_type_of(c)] for c in (k_cache, v_cache))
    # the struct's biases and angles are in the activation dtype; x is taken in it
    y = native.block_decode(struct, step, to_dtype(x, backend.act_dtype))
    return to_dtype(y, x.dtype)


def _caches_ok(k_cache: Any, v_cache: Any, block: Any) -> bool:
    """Whole caches of this block's shape (in any stored type: the C block rounds the
    token's K and V as each stores them)."""
    shape = (block.n_head_kv, block.head_dim)
    for c in (k_cache, v_cache):
        held = getattr(c, "blocks", c)  # a q8_0 cache's bytes
        if not held.is_contiguous() or tuple(c.shape[1:]) != shape:
            return False
    return True


def _block_struct(backend: Any, block: Any) -> BlockStruct | None:
    """The C struct of ``block``, made once per block (None: a weight has no native kernel)."""
    cache = backend._block_structs
    hit = cache.get(id(block))
    if hit is not None and hit[0] is block:
        return hit[1]
    struct = _make_struct(backend, block)
    cache[id(block)] = (block, struct)  # the block kept with it: its id stays its own
    return struct


def _make_struct(backend: Any, block: Any) -> BlockStruct | None:
    found = {}
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        found[name] = backend._native_gemv(getattr(block, name), 1)
        if found[name] is None:
            return None
    kinds = {name: kind for name, (kind, _) in found.items()}
    if not set(kinds.values()) <= BLOCK_GGML_TYPES.keys():
        return None
    dtype = backend.act_dtype  # the block's C code reads x, biases and angles in it
    biases = [getattr(block, name) for name in ("bq", "bk", "bv")]
    if dtype != backend.torch_dtype:  # float32 activations: float32 bias copies, made once
        biases = [backend._f32_weight(b) for b in biases]
    if any(b is not None and (b.dtype != dtype or not b.is_contiguous()) for b in biases):
        return None
    n_embd, n_ff = block.wq.shape[1], block.w_gate.shape[0]
    s = BlockStruct(
        n_embd=n_embd,
        n_head=block.n_head,
        n_head_kv=block.n_head_kv,
        head_dim=block.head_dim,
        n_ff=n_ff,
        n_rot=block.n_rot,
        eps=block.rms_eps,
        scale=block.attn_scale,
        neox=int(block.rope_neox),
    )
    for name, (kind, raw) in found.items():  # wq -> type_q ... w_gate -> type_gate
        setattr(s, name, raw.data_ptr())
        setattr(s, f"type_{name[1:].lstrip('_')}", BLOCK_GGML_TYPES[kind])
    keep = [raw for _, raw in found.values()]
    for name, bias in zip(("bq", "bk", "bv"), biases, strict=True):
        setattr(s, name, None if bias is None else bias.data_ptr())
        keep.append(bias)
    for name in ("attn_norm", "ffn_norm", "q_norm", "k_norm"):
        w = backend._f32_weight(getattr(block, name))  # float32 copies, made once
        setattr(s, name, None if w is None else w.data_ptr())
        keep.append(w)
    s.keep = keep  # the tensors behind the addresses live as long as the struct
    return s


def _step_struct(
    backend: Any, kv_rows: Any, block: Any, positions: np.ndarray, cell: int
) -> StepStruct | None:
    """The token's struct, made once per ubatch (every layer of the step shares it)."""
    rope = (block.n_rot, block.rope_freq_base, block.rope_freq_scale)
    hit = backend._block_step
    if hit is not None and hit[0] is kv_rows and hit[1] == rope and hit[2] == cell:
        return hit[3]
    step = None
    rows = kv_rows.rows
    if rows.shape[0] == 1 and kv_rows.q_rows.shape == (1, 1) and kv_rows.allowed().all():
        cos, sin = backend._rope_table(positions, *rope)
        cells = np.ascontiguousarray(rows[0], dtype=np.int64)
        step = StepStruct(
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            cell=int(cell),
            rows=cells.ctypes.data,
            n_rows=len(cells),
        )
        step.keep = (cos, sin, cells)
    backend._block_step = (kv_rows, rope, cell, step)
    return step
