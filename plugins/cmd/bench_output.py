"""Records and output formats of ``tessera bench`` (llama-bench's fields and table).

A record has llama-bench's JSON field names (``n_prompt``, ``n_gen``, ``avg_ts``,
``stddev_ts``, ``samples_ns`` ...) plus tessera's own: ``backend_device``, ``dtype``,
``kv_path``, ``prune`` (the context's choice: on/off), ``pruned`` (whether a ubatch was
really cut down before the KV-shared layers) and ``prune_reason``; with an expert cache
(``--moe-cache-mib``), ``moe_cache_budget_bytes`` and the cache's counters over the test's
timed runs (``moe_cache_hits``, ``moe_cache_misses``, ``moe_cache_hit_rate``,
``moe_cache_evictions``, ``moe_cache_bytes_moved``; the md table's "moe hits" column).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def model_facts(model: Any) -> tuple[str, int, int]:
    """``(model_type, model_size in bytes, model_n_params)``."""
    shapes = model.arch.tensor_shapes(model.config)
    n_params = int(sum(int(np.prod(s)) for s in shapes.values()))
    path = Path(model.path)
    if path.is_file():
        size = path.stat().st_size
    else:  # a folder or an in-memory shape model: the weights in the compute dtype
        size = n_params * _DTYPE_BYTES.get(model.backend.dtype, 4)
    arch = model.metadata.get("general.architecture", type(model.config).__name__)
    name = model.metadata.get("general.name", path.name)
    return f"{arch} {name}", size, n_params


def test_record(model: Any, test: Any) -> dict[str, Any]:
    """One result row in llama-bench's JSON field names (plus tessera's)."""
    from tessera import __version__

    model_type, size, n_params = model_facts(model)
    inst = test.instance
    n_tokens = test.n_prompt + test.n_gen
    samples_ts = [n_tokens / (ns / 1e9) for ns in test.samples_ns]
    avg_ns, stddev_ns = _mean_std([float(ns) for ns in test.samples_ns])
    avg_ts, stddev_ts = _mean_std(samples_ts)
    backend = model.backend
    record = {
        "build_commit": "",
        "build_number": 0,
        "tessera_version": __version__,
        "cpu_info": platform.processor() or platform.machine(),
        "gpu_info": "",
        "backends": backend.name,
        "backend_device": backend.device,
        "dtype": backend.dtype,
        "model_filename": str(model.path),
        "model_type": model_type,
        "model_size": size,
        "model_n_params": n_params,
        "n_batch": inst.n_batch,
        "n_ubatch": inst.n_ubatch,
        "n_threads": inst.n_threads,
        "type_k": inst.type_k or backend.dtype,
        "type_v": inst.type_v or backend.dtype,
        "flash_attn": inst.flash_attn,
        "kv_path": test.kv_path,
        "prune": inst.prune,
        "pruned": test.pruned,
        "prune_reason": test.prune_reason,
        "embeddings": False,
        "n_prompt": test.n_prompt,
        "n_gen": test.n_gen,
        "n_depth": test.n_depth,
        "test": test.name,
        "test_time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "avg_ns": int(avg_ns),
        "stddev_ns": int(stddev_ns),
        "avg_ts": avg_ts,
        "stddev_ts": stddev_ts,
        "samples_ns": list(test.samples_ns),
        "samples_ts": samples_ts,
    }
    if test.moe_cache is not None:
        record.update(_moe_cache_fields(model, test.moe_cache))
    return record


def _moe_cache_fields(model: Any, counters: dict[str, int]) -> dict[str, Any]:
    lookups = counters["hits"] + counters["misses"]
    return {
        "moe_cache_budget_bytes": model.experts.cache.budget_bytes,
        **{f"moe_cache_{k}": v for k, v in counters.items()},
        "moe_cache_hit_rate": counters["hits"] / lookups if lookups else 0.0,
    }


_MD_COLUMNS = ("model", "size", "params", "backend", "threads", "n_ubatch", "fa", "kv path",
               "prune", "pruned", "test", "t/s")  # fmt: skip


def _md_cells(r: dict[str, Any]) -> list[str]:
    params = r["model_n_params"]
    cells = [
        r["model_type"],
        f"{r['model_size'] / 2**30:.2f} GiB",
        f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M",
        f"{r['backends']}/{r['dtype']}",
        str(r["n_threads"] or "default"),
        str(r["n_ubatch"]),
        r["flash_attn"],
        r["kv_path"],
        r["prune"],
        "yes" if r["pruned"] else "no",
        r["test"],
        f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
    ]
    if "moe_cache_hits" in r:
        lookups = r["moe_cache_hits"] + r["moe_cache_misses"]
        cells.append(f"{r['moe_cache_hit_rate']:.0%} of {lookups}")
    return cells


class Printer:
    """Writes records as they come (md, jsonl) or all at the end (json, csv)."""

    def __init__(self, fmt: str, out: Any = None) -> None:
        self.fmt = fmt
        self.out = out or sys.stdout
        self.records: list[dict[str, Any]] = []

    def _line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _md_header(self, record: dict[str, Any] | None) -> None:
        # Written with the first row: its columns depend on the record (expert cache or not).
        columns = _MD_COLUMNS + (("moe hits",) if record and "moe_cache_hits" in record else ())
        self._line("| " + " | ".join(columns) + " |")
        self._line("|" + "|".join("-" * (len(c) + 2) for c in columns) + "|")

    def row(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.fmt == "md":
            if len(self.records) == 1:
                self._md_header(record)
            self._line("| " + " | ".join(_md_cells(record)) + " |")
        elif self.fmt == "jsonl":
            self._line(json.dumps(record))

    def close(self) -> None:
        if self.fmt == "md" and not self.records:
            self._md_header(None)
        if self.fmt == "json":
            self._line(json.dumps(self.records, indent=2))
        elif self.fmt == "csv" and self.records:
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=list(self.records[0]), lineterminator="\n")
            writer.writeheader()
            for r in self.records:
                writer.writerow({k: " ".join(map(str, v)) if isinstance(v, list) else v
                                 for k, v in r.items()})  # fmt: skip
            self.out.write(buf.getvalue())
            self.out.flush()
