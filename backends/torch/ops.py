"""The torch backend: :class:`TorchBackend`, every op of :mod:`tessera.contract.backend` on
torch tensors.

Imported only when a torch backend is created (see :mod:`tessera.backends.torch.backend`).
The class is one backend assembled from one mixin per op family: weights
(:mod:`.weights`), normalizations (:mod:`.norms`), RoPE (:mod:`.rope`), attention
(:mod:`.attention`) and transfers (:mod:`.transfers`); this module holds its setup, the
arrays, the elementwise ops and the fused ops' entry points (:mod:`.block`, :mod:`.moe`).

Autograd: no tensor made here requires grad, so torch records no graph. Callers may run
the forward pass inside ``torch.inference_mode()`` to also skip version counting; every
op works inside and outside it (``set_rows`` enters it for caches created inside it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.torch.activations import DTYPE_NAMES, choose_activations, choose_attention
from tessera.backends.torch.attention import AttentionOps
from tessera.backends.torch.backend import INFERENCE_MODE
from tessera.backends.torch.kv_store import KV_STORE_TYPES, Q8_0Rows, make_cache
from tessera.backends.torch.norms import NormOps
from tessera.backends.torch.packed import PackedLinear
from tessera.backends.torch.recurrent import RecurrentLayerOps
from tessera.backends.torch.rope import RopeOps
from tessera.backends.torch.transfers import TransferOps
from tessera.backends.torch.weights import WeightOps
from tessera.contract.backend import CORE_OPS, OPTIONAL_OPS, Backend
from tessera.contract.ops import Op
from tessera.switches import Choice, flag

TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


class TorchBackend(
    WeightOps, NormOps, RopeOps, AttentionOps, TransferOps, RecurrentLayerOps, Backend
):
    """Every op on torch tensors of one device and compute dtype (the mixins' state is made
    here, so one place lists all of it)."""

    name = "torch"

    def __init__(self, device: torch.device, dtype: str, exact_f32: bool | None = None) -> None:
        super().__init__()
        self.torch_device = device
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.device = str(device)
        self.dtype = dtype
        #: f32 asked for by name: the exact torch paths, no native kernels (None: any f32;
        #: backend.create passes whether it was asked for)
        self.exact_f32 = dtype == "f32" if exact_f32 is None else exact_f32
        #: The dtype of the tensors between ops (float32 with bf16 weights on the CPU).
        choice = self.record_path("activations", choose_activations(device, self.torch_dtype))
        self.act_dtype = TORCH_DTYPES[choice.path]
        #: The dtype SDPA multiplies in (the compute dtype unless TESSERA_TORCH_F32_ATTENTION).
        choice = self.record_path(
            "prefill attention", choose_attention(self.act_dtype, self.torch_dtype)
        )
        self.attn_dtype = TORCH_DTYPES[choice.path]
        #: Probe answers of weight kernels, by quant type name (filled by the kernels), and
        #: "native": the native decode kernels' status (tessera.backends.native.probe).
        self.probe_cache: dict[str, Any] = {}
        self._kernels: dict[str, Any] = {}
        self._inv_freq: dict[tuple[int, float, float], torch.Tensor] = {}
        self._rope_tables: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._mask_inputs: tuple[np.ndarray, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._rows_inputs: tuple[Any, dict[str, Any]] | None = None
        self._fused_norm: bool | None = None  # probed on first use
        self._f32_weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # decoder_block's C structs: per block (by id, the block kept with it) and per ubatch
        self._block_structs: dict[int, tuple[Any, Any]] = {}
        self._block_step: tuple[Any, ...] | None = None
        self._packed_linear: PackedLinear | None = None  # made on first use
        self._widen_buffer: torch.Tensor | None = None  # 16-bit weights widened per matmul
        self._chunked_delta: Choice | None = None  # the gated delta rule's path, on first use

    # -- capability probe and setup --------------------------------------------------

    def supports(self, op: Op) -> bool:
        if op.name not in CORE_OPS + OPTIONAL_OPS:
            return False
        if op.name in ("rope", "rope_ext"):
            n_rot, head_dim = op.get("n_rot", 0), op.get("head_dim")
            return n_rot % 2 == 0 and (head_dim is None or n_rot <= head_dim)
        if op.name == "kv_cache":
            return op.get("type") in KV_STORE_TYPES
        if op.name in ("attention", "attention_rows", "attention_softcap"):
            n_head, n_head_kv = op.get("n_head", 1), op.get("n_head_kv", 1)
            return n_head_kv > 0 and n_head % n_head_kv == 0
        return True

    def use_kernels(self, kernels: Mapping[tuple[str, str], Any]) -> None:
        self._kernels = {qt: k for (backend, qt), k in kernels.items() if backend == self.name}

    def set_threads(self, n_threads: int) -> None:
        if n_threads > 0:
            torch.set_num_threads(n_threads)

    def _native(self) -> Any:
        """The native CPU kernels (tessera.backends.native.probe) or None; probed once, the
        answer kept in ``probe_cache["native"]``."""
        status = self.probe_cache.get("native")
        if status is None or "kernel paths" not in self.probe_cache:
            from tessera.backends.native import probe as native_probe
            from tessera.backends.torch.kernel_paths import record_kernel_paths

            status = native_probe.status(self)
            record_kernel_paths(self)  # each kernel family's path, for tessera plugins / -v
        return status.gemv

    # -- arrays ----------------------------------------------------------------------

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        a = np.asarray(a)
        if not (a.flags.writeable and a.flags.c_contiguous):
            a = np.array(a)  # torch.from_numpy wants memory it may own a view of
        return torch.from_numpy(a)

    def from_numpy(self, a: np.ndarray) -> torch.Tensor:
        t = self._tensor(a)
        if t.is_floating_point():
            return t.to(device=self.torch_device, dtype=self.torch_dtype)
        return t.to(self.torch_device)

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        if isinstance(x, Q8_0Rows):  # a q8_0 KV cache: the values it holds
            return x.values(slice(None), torch.float32).cpu().numpy()
        x = x.detach()
        if x.is_floating_point():
            x = x.float()
        return x.cpu().numpy()

    def zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.torch_dtype, device=self.torch_device)

    def kv_cache(self, shape: tuple[int, ...], cache_type: str) -> Any:
        return make_cache(shape, cache_type, self.torch_device)

    def _index(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.torch_device)

    # -- elementwise ops -------------------------------------------------------------

    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def mul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b

    def scale(self, x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def concat(self, xs: Any) -> torch.Tensor:
        return torch.cat(list(xs), dim=-1)

    def swiglu_oai(self, gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float):
        g = gate.clamp(max=limit)
        return g * torch.sigmoid(alpha * g) * (up.clamp(-limit, limit) + 1.0)

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    def gelu_erf(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    # -- fused ops and the forward pass ----------------------------------------------

    def moe_ffn(self, x, expert_ids, expert_weights, experts):
        from tessera.backends.torch.moe import moe_ffn

        return moe_ffn(self, x, expert_ids, expert_weights, experts)

    def forward_scope(self) -> Any:
        """``torch.inference_mode()``: no autograd bookkeeping per op (1-5% of a one-sentence
        BERT forward); ``TESSERA_TORCH_INFERENCE_MODE=0`` turns it off."""
        if not flag(INFERENCE_MODE):
            return contextlib.nullcontext()
        return torch.inference_mode()
