"""The engines bench/perf_vs_llamacpp.py compares: tessera, llama.cpp (a ``llama-bench``
binary or llama-cpp-python) and HF transformers.

Each engine's ``run(n_prompt, n_gen, n_depth)`` returns the seconds of one llama-bench test:
``n_prompt`` tokens in one batch or ``n_gen`` tokens one at a time, after ``n_depth``
tokens were put into the cache untimed (llama-bench's ``-d``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import perf_models


class TesseraEngine:
    """tessera's torch backend; ``env`` (switches, read when weights load) makes a variant;
    ``cache_types`` are the context's ``-ctk`` / ``-ctv``."""

    def __init__(
        self,
        path: Path,
        runtime: Any,
        threads: int,
        n_ctx: int,
        label: str = "",
        env: dict[str, str] | None = None,
        cache_types: tuple[str, str] = ("", ""),
    ) -> None:
        from tessera.engine.context import Context, ContextParams
        from tessera.files.load import load_model

        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.model = load_model(path, runtime, "torch")
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        self.model.backend.set_threads(threads)
        type_k, type_v = cache_types
        params = ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, type_k=type_k, type_v=type_v)
        self.ctx = Context(self.model, params)
        self.name = f"tessera {self.model.backend.dtype}" + (f" {label}" if label else "")
        self.rng = np.random.default_rng(0)

    def run(self, n_prompt: int, n_gen: int, n_depth: int = 0) -> float:
        from tessera.plugins.cmd.bench import Instance, Test, run_test

        test = Test(Instance(512, 512, 0, "auto", "on"), n_prompt, n_gen, n_depth=n_depth)
        return run_test(self.ctx, test, self.rng) / 1e9


class TesseraBenchEngine:
    """Another tessera install (an older tree's virtual environment, say): one
    ``EXE bench -r 2`` process per test, timed by tessera bench itself, the second run
    counted (the first one pays what a fresh process does once, as the in-process engine
    did in its warm-up); the batch sizes are the in-process engine's (512)."""

    def __init__(self, label: str, exe: str, path: Path, threads: int) -> None:
        self.exe, self.path, self.threads = exe, path, threads
        self.name = f"tessera {label}"

    def run(self, n_prompt: int, n_gen: int, n_depth: int = 0) -> float:
        if n_depth:
            raise SystemExit(f"{self.name}: --tessera-exe runs depth 0 only (-d 0)")
        cmd = [self.exe, "bench", "-m", str(self.path), "-p", str(n_prompt), "-n", str(n_gen)]
        cmd += ["-t", str(self.threads), "-r", "2", "-b", "512", "-ub", "512", "-o", "json"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        records = json.loads(done.stdout[done.stdout.index("[") :])
        return sum(r["samples_ns"][-1] for r in records if r["n_prompt"] or r["n_gen"]) / 1e9


class HFEngine:
    def __init__(self, tessera_model: Any, dtype: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        config = perf_models.hf_config(tessera_model)
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
        self.n_vocab = config.vocab_size
        self.name = f"HF {dtype}"

    def run(self, n_prompt: int, n_gen: int, n_depth: int = 0) -> float:
        import torch
        from transformers import DynamicCache

        ids = torch.randint(0, self.n_vocab, (1, n_depth + max(n_prompt, n_gen)))
        cache = DynamicCache()
        with torch.inference_mode():
            if n_depth:  # untimed, as llama-bench's -d
                self.model(ids[:, :n_depth], past_key_values=cache, logits_to_keep=1)
            start = time.perf_counter()
            if n_prompt:
                self.model(ids[:, n_depth : n_depth + n_prompt], past_key_values=cache,
                           logits_to_keep=1)  # fmt: skip
            for i in range(n_depth, n_depth + n_gen):
                self.model(ids[:, i : i + 1], past_key_values=cache, logits_to_keep=1)
        return time.perf_counter() - start


class LlamaBenchEngine:
    """One ``llama-bench -r 1`` process per test (it reports the test's own time)."""

    def __init__(
        self, binary: str, path: Path, threads: int, cache_types: tuple[str, str] = ("", "")
    ) -> None:
        self.binary, self.path, self.threads = binary, path, threads
        self.cache_types = cache_types
        self.name = "llama.cpp"

    def run(self, n_prompt: int, n_gen: int, n_depth: int = 0) -> float:
        cmd = [self.binary, "-m", str(self.path), "-p", str(n_prompt), "-n", str(n_gen)]
        cmd += ["-d", str(n_depth), "-t", str(self.threads), "-r", "1", "-o", "json"]
        cmd += ["--no-warmup"]
        for flag, kind in zip(("-ctk", "-ctv"), self.cache_types, strict=True):
            cmd += [flag, kind] if kind else []  # none: llama.cpp's f16
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        return sum(record["avg_ns"] for record in json.loads(out)) / 1e9  # a pp and/or a tg


class LlamaCppPythonEngine:
    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.name = "llama.cpp (python)"

    def run(self, n_prompt: int, n_gen: int, n_depth: int = 0) -> float:
        count = n_depth + max(n_prompt, n_gen)
        tokens = np.random.default_rng(0).integers(0, self.n_vocab, count).tolist()
        self.llm.reset()
        if n_depth:
            self.llm.eval(tokens[:n_depth])
        start = time.perf_counter()
        if n_prompt:
            self.llm.eval(tokens[n_depth : n_depth + n_prompt])
        for t in tokens[n_depth : n_depth + n_gen]:
            self.llm.eval([t])
        return time.perf_counter() - start


def llama_engine(args: Any, path: Path, n_ctx: int) -> Any:
    """llama-bench when ``--llama-bench`` names it, else llama-cpp-python, else None."""
    if args.llama_bench:
        return LlamaBenchEngine(args.llama_bench, path, args.threads, args.cache_types)
    try:
        return LlamaCppPythonEngine(path, args.threads, n_ctx)
    except ImportError:
        return None
