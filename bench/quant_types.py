"""Side-by-side numbers for every ``tessera quantize`` file type (docs/quant-types.md).

    .venv/bin/python bench/quant_types.py [--model core/default_model/tessera-default.gguf]

For each file type whose quant types are installed (the others are listed with the type
they lack): file size; top-1 agreement and mean KL(F32 || type) of the next-token
distributions over a fixed text (every position, numpy backend); and the torch backend's
matmul time for one weight kernel per type (1 row = decode, 128 rows = prefill) next to a
dense bf16 weight of the same shape. All in one process, one type after the other, so a
busy machine slows every row alike; run it twice and compare before trusting a small gap.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import TesseraError
from tessera.files.gguf import RawTensor
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model
from tessera.plugins.cmd.quantize_types import FILE_TYPES

TEXT = (
    "The Python tutorial introduces the reader informally to the basic concepts and "
    "features of the language. It helps to have a Python interpreter handy for hands-on "
    "experience, but all examples are self-contained, so the tutorial can be read off-line."
)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def text_logits(path: Path, runtime: Runtime, ids: list[int]) -> np.ndarray:
    model = load_model(path, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=max(64, len(ids))))
    return ctx.decode(Batch.for_sequence(ids, logits="all"))


def matmul_ms(weight, backend, rows: int, n_in: int, repeat: int) -> float:
    import torch

    x = backend.from_numpy(np.random.default_rng(0).standard_normal((rows, n_in), np.float32))
    with torch.inference_mode():
        backend.matmul(x, weight)
        start = time.perf_counter()
        for _ in range(repeat):
            backend.matmul(x, weight)
    return (time.perf_counter() - start) / repeat * 1e3


def kernel_table(runtime: Runtime, n: int) -> None:
    backend = runtime.create_backend("torch", "cpu", "bf16")
    kernels = runtime.weight_kernels()
    w = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32) * 0.02
    print(f"\ntorch cpu bf16, {n}x{n} weight, ms per matmul (lower is better)")
    print(f"{'type':10} {'1 row':>8} {'128 rows':>9}  path")
    dense = backend.from_numpy(w)
    print(
        f"{'bf16':10} {matmul_ms(dense, backend, 1, n, 50):8.3f} "
        f"{matmul_ms(dense, backend, 128, n, 10):9.3f}  dense bf16"
    )
    for name in ("Q8_0", "Q4_0", "Q4_K", "Q6_K", "FP8_E4M3"):
        qt = runtime.quant_type_by_name(name)
        kernel = kernels.get(("torch", name))
        if kernel is None:
            print(f"{name:10} no kernel")
            continue
        used = "used" if kernel.supports(backend) else "declined by its probe here"
        weight = kernel.load(backend, RawTensor("w", qt.ggml_type, w.shape, qt.quantize_tensor(w)))
        print(
            f"{name:10} {matmul_ms(weight, backend, 1, n, 50):8.3f} "
            f"{matmul_ms(weight, backend, 128, n, 10):9.3f}  {kernel.description} ({used})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="F32/F16 GGUF (default: bundled model)")
    parser.add_argument("--matmul-n", type=int, default=2048, help="square weight size")
    args = parser.parse_args()
    runtime = Runtime()
    src = Path(args.model or default_model_path())
    ids = load_model(src, runtime, "numpy").tokenizer.encode(TEXT)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        quantize_model(src, f32, "f32", runtime)
        ref = log_softmax(text_logits(f32, runtime, ids))
        print(f"{src.name}: {len(ids)} tokens of fixed text, next-token distributions vs F32")
        print(f"{'type':10} {'MiB':>7} {'quantize s':>10} {'top-1':>7} {'mean KL':>9}")
        for target in FILE_TYPES:
            out = Path(tmp) / f"{target}.gguf"
            start = time.perf_counter()
            try:
                quantize_model(src, out, target, runtime)
            except TesseraError as error:  # a quant type it needs is not installed
                print(f"{target:10} not measured: {error}")
                continue
            seconds = time.perf_counter() - start
            logp = log_softmax(text_logits(out, runtime, ids))
            kl = (np.exp(ref) * (ref - logp)).sum(axis=-1).mean()
            top1 = (logp.argmax(-1) == ref.argmax(-1)).mean()
            size = out.stat().st_size / 2**20
            print(f"{target:10} {size:7.2f} {seconds:10.2f} {top1:7.3f} {kl:9.5f}")
    kernel_table(runtime, args.matmul_n)


if __name__ == "__main__":
    main()
