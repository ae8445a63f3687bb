"""Prefill matmuls of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL weights with int8 dot
products on CPUs without AMX (AVX512-VNNI, AVX-VNNI or AVX2, whichever the library was
built for): ``native_vnni_gemm.c``'s ``tsr_matmul_vnni`` and
``tsr_swiglu_vnni`` as methods of :class:`VnniGemm` (a mixin of
:class:`~tessera.backends.native.kernels.NativeGemv`).

The activations are quantized once per call to int8 blocks of 32 (one float scale each,
as llama.cpp's Q8_0 activations); the fused gate/up SwiGLU quantizes them once for both
weights. :meth:`~tessera.backends.native.kernels.NativeGemv.matmul_tiles` and
``swiglu_tiles`` run this kernel where the AMX tiles do not serve (a CPU without AMX, or
``TESSERA_NATIVE_AMX_DISABLE=1``); ``TESSERA_NATIVE_VNNI_GEMM_DISABLE=1``
(:data:`NATIVE_VNNI_GEMM_DISABLE`) turns it off, leaving those matmuls to the quant types'
dequantize-and-matmul paths (Q4_1, Q5_0, Q5_1 and IQ4_NL weights call
:meth:`VnniGemm.matmul_vnni` themselves, ``plugins/quant/native_weight.py``). The choice is
recorded as the backend's ``"native VNNI prefill GEMM"`` path.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from tessera.switches import OFF, Choice, Switch, choose

NATIVE_VNNI_GEMM_DISABLE = Switch(
    "TESSERA_NATIVE_VNNI_GEMM_DISABLE",
    "Q4_0/Q8_0 matmuls of many rows (prefill) on CPUs without AMX (or with it switched off) "
    "stay off the int8 VNNI GEMM: dequantized and multiplied by torch instead",
    OFF,
)
#: Matmuls of at least this many rows run the int8 GEMM (fewer: the decode GEMV).
VNNI_MIN_ROWS = 16
#: GGML type numbers of the weight types the GEMM reads (blocks of 32 with one f16 scale).
VNNI_GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "IQ4_NL": 20}
#: Their bytes per block of 32 weights.
VNNI_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "IQ4_NL": 18}


def declare_vnni_gemm(lib: Any) -> None:
    """The C signatures: (GGML type, weight(s), n_out, n_in, x, rows, y, x's dtype, y's
    dtype, threads)."""
    after = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    after += [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.tsr_matmul_vnni.argtypes = [ctypes.c_int, ctypes.c_void_p] + after
    lib.tsr_swiglu_vnni.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + after
    lib.tsr_matmul_vnni.restype = lib.tsr_swiglu_vnni.restype = ctypes.c_int
    lib.tsr_vnni_gemm_built.restype = ctypes.c_int


#: ``tsr_vnni_gemm_built()``'s codes: the instructions the GEMM was compiled for.
GEMM_BUILDS = {3: "AVX512-VNNI", 2: "AVX-VNNI (256-bit)", 1: "AVX2 (256-bit)"}


def vnni_choice(lib: Any, amx: bool, portable: bool = False) -> Choice:
    """Whether the int8 GEMM takes prefill matmuls: not where the AMX tiles do (``amx``),
    not on the portable path (``portable``), not when switched off, not in a build without
    AVX2; its reason names the build's instructions (:data:`GEMM_BUILDS`)."""

    def probe() -> tuple[bool, str]:
        if amx:
            return False, "the AMX tiles take these matmuls"
        if portable:
            return False, "the portable path leaves these matmuls to torch"
        build = GEMM_BUILDS.get(lib.tsr_vnni_gemm_built())
        if build is None:
            return False, "built without AVX2 (CPU, compiler or TESSERA_NATIVE_PATH)"
        return True, f"int8 {build} GEMM for {VNNI_MIN_ROWS} rows or more"

    return choose(NATIVE_VNNI_GEMM_DISABLE, probe, on="on", off="off")


class VnniGemm:
    """The int8 prefill GEMM's methods; ``vnni_gemm`` and ``vnni_gemm_choice`` are set by
    :func:`tessera.backends.native.library.load`."""

    lib: Any
    _dtypes: dict[Any, int]
    _threads: Any
    vnni_gemm = False
    vnni_gemm_choice = Choice("off", "not probed")

    def choose_vnni_gemm(self, amx: bool, portable: bool = False) -> None:
        """Sets ``vnni_gemm_choice`` by :func:`vnni_choice` and ``vnni_gemm`` from it."""
        self.vnni_gemm_choice = vnni_choice(self.lib, amx, portable)
        self.vnni_gemm = self.vnni_gemm_choice.path == "on"

    def vnni_serves(self, n_rows: int, n_out: int, dtype: Any, multiple: int = 32) -> bool:
        """Whether :meth:`matmul_vnni` takes this shape: the GEMM is on, ``n_rows`` at least
        :data:`VNNI_MIN_ROWS`, ``dtype`` bf16, f16 or f32 (the CPUs without fast bf16
        compute in f32; their decode GEMVs round the activations to int8 blocks too),
        ``n_out`` a multiple of ``multiple`` (32; the SwiGLU's: 16)."""
        import torch

        ok = self.vnni_gemm and n_rows >= VNNI_MIN_ROWS and n_out % multiple == 0
        return ok and dtype in (torch.bfloat16, torch.float16, torch.float32)

    def matmul_vnni(
        self,
        kind: str,
        ws: tuple[Any, ...],
        x: Any,
        out_dtype: Any = None,
        compute_dtype: Any = None,
    ) -> Any:
        """``x @ W.T`` (one weight) or ``silu(x @ W_gate.T) * (x @ W_up.T)`` (two of one
        shape) for ``kind`` one of :data:`VNNI_GGML_TYPES`, block bytes ``(n_out, row
        bytes)`` and ``x`` a ``(T, n_in)`` CPU tensor; the result in ``out_dtype`` (default
        ``x``'s: bf16, f16 or f32). None where :meth:`vnni_serves` says no for the backend's
        ``compute_dtype`` (default ``x``'s; bf16 for float32 activations beside bf16
        weights) or the shapes differ."""
        import torch

        n_out = ws[0].shape[0]
        multiple = 32 if len(ws) == 1 else 16
        if kind not in VNNI_GGML_TYPES or not self.vnni_serves(
            x.shape[0], n_out, compute_dtype or x.dtype, multiple
        ):
            return None
        if len(ws) == 2 and ws[0].shape != ws[1].shape:
            return None
        if not x.is_contiguous():
            x = x.contiguous()
        n_rows, n_in = x.shape
        row_bytes = n_in // 32 * VNNI_BLOCK_BYTES[kind]
        if n_in % 32 or any(w.shape[1] != row_bytes or not w.is_contiguous() for w in ws):
            raise ValueError(
                f"{kind} weights for {n_in} inputs must be contiguous rows of {row_bytes} "
                f"bytes, not {ws[0].shape[1]}: pass the weight's GGUF block bytes"
            )
        out_dtype = out_dtype or x.dtype
        y = torch.empty((n_rows, n_out), dtype=out_dtype)
        fn = self.lib.tsr_matmul_vnni if len(ws) == 1 else self.lib.tsr_swiglu_vnni
        done = fn(
            VNNI_GGML_TYPES[kind], *(w.data_ptr() for w in ws), n_out, n_in, x.data_ptr(),
            n_rows, y.data_ptr(), self._dtypes[x.dtype], self._dtypes[out_dtype], self._threads(),
        )  # fmt: skip
        return y if done else None


def random_blocks(kind: str, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_out, row bytes)`` uint8 blocks of ``kind``: random normal weights quantized by
    ``gguf.quants``, or (IQ4_NL, which it cannot quantize) random codes under random f16
    scales."""
    from gguf import GGMLQuantizationType, quants

    if kind != "IQ4_NL":
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        return quants.quantize(w, GGMLQuantizationType[kind])
    nb = n_in // 32
    scales = (rng.standard_normal((n_out, nb, 1)) * 0.02).astype("<f2").view(np.uint8)
    codes = rng.integers(0, 256, (n_out, nb, 16), dtype=np.uint8)
    return np.concatenate([scales, codes], axis=2).reshape(n_out, nb * 18)


def vnni_gemm_ok(native: Any) -> bool:
    """The GEMM and its SwiGLU on random weights of every type it reads
    (:func:`random_blocks`; 35 rows, 160 inputs: an odd block count, a ragged last group of
    rows) vs their ``gguf.quants`` dequantization times x in float64, within the int8
    activations' error bound and one bf16 rounding."""
    import torch

    from tessera.backends.native.selftest import _GgufOracle, error_bound

    rng = np.random.default_rng(2)
    for name in VNNI_GGML_TYPES:
        oracle = _GgufOracle(name)
        raws = [torch.from_numpy(random_blocks(name, 48, 160, rng)) for _ in range(2)]
        dense = [oracle.dequantize(r.numpy()).astype(np.float64) for r in raws]
        x = torch.from_numpy(rng.standard_normal((35, 160)).astype(np.float32)).bfloat16()
        xs = x.double().numpy()
        got = native.matmul_vnni(name, (torch.cat(raws[:1] * 2),), x)
        want = xs @ np.concatenate([dense[0]] * 2).T
        bound = error_bound(np.concatenate([dense[0]] * 2), xs) + 2.0**-8 * np.abs(want)
        if got is None or not np.all(np.abs(got.double().numpy() - want) <= bound):
            return False
        got = native.matmul_vnni(name, tuple(raws), x)
        g, u = xs @ dense[0].T, xs @ dense[1].T
        want = g / (1 + np.exp(-g)) * u
        bound = np.abs(u) * error_bound(dense[0], xs) * 1.1 + np.abs(g) * error_bound(dense[1], xs)
        bound += error_bound(dense[0], xs) * error_bound(dense[1], xs) + 2.0**-8 * np.abs(want)
        if got is None or not np.all(np.abs(got.double().numpy() - want) <= bound + 1e-6):
            return False
    return True
