"""The numbers and tables of bench/server_load.py: percentiles, one row per (engine, client
count) and the side-by-side table of two engines with their ratios.

Pure functions of the measured requests, so that they can be tested without a server.
"""

from __future__ import annotations

import math
from typing import Any

#: Columns of the one-engine table: (header, row key, format).
COLUMNS = [
    ("clients", "clients", "{}"),
    ("requests", "requests", "{}"),
    ("failed", "failed", "{}"),
    ("req/s", "req_per_s", "{:.2f}"),
    ("out tok/s", "out_tok_per_s", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p95 ms", "ttft_p95_ms", "{:.0f}"),
    ("ITL p50 ms", "itl_p50_ms", "{:.1f}"),
    ("ITL p95 ms", "itl_p95_ms", "{:.1f}"),
]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` with linear interpolation between the two
    nearest ranks (numpy's default method); NaN for no values."""
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(
    engine: str, n_clients: int, results: list[dict], failures: list[str], wall: float
) -> dict[str, Any]:
    """One table row from the requests of one client count: each result has ``ttft`` (s),
    ``itl`` (list of s between streamed chunks), ``n_tokens`` and ``n_prompt``."""
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    n_out = sum(r["n_tokens"] for r in results)
    return {
        "engine": engine,
        "clients": n_clients,
        "requests": len(results),
        "failed": len(failures),
        "failures": failures[:3],
        "wall_s": wall,
        "out_tokens": n_out,
        "prompt_tokens_mean": sum(r["n_prompt"] for r in results) / len(results)
        if results
        else float("nan"),
        "req_per_s": len(results) / wall,
        "out_tok_per_s": n_out / wall,
        "ttft_p50_ms": percentile(ttft, 0.5) * 1e3,
        "ttft_p95_ms": percentile(ttft, 0.95) * 1e3,
        "itl_p50_ms": percentile(itl, 0.5) * 1e3,
        "itl_p95_ms": percentile(itl, 0.95) * 1e3,
    }


def _cells(row: dict[str, Any]) -> list[str]:
    return [fmt.format(row[key]) for _, key, fmt in COLUMNS]


def engine_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of one engine's rows (the table without a second engine)."""
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |"]
    lines.append("|" + "---:|" * len(COLUMNS))
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return lines


def ratio(a: float, b: float) -> float:
    """``a / b``; NaN where either is NaN or ``b`` is zero (a run with no good request)."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return float("nan")
    return a / b


def side_by_side(rows: list[dict[str, Any]], base: str, other: str) -> list[str]:
    """Markdown lines: per client count, each engine's output tok/s, TTFT p50/p95, ITL p95
    and failures, then ``base``/``other`` for tok/s (higher is better for ``base``) and
    for TTFT p95 (lower is better for ``base``)."""
    by_key = {(r["engine"], r["clients"]): r for r in rows}
    counts = sorted({r["clients"] for r in rows})
    missing = [(e, n) for n in counts for e in (base, other) if (e, n) not in by_key]
    if missing:
        raise ValueError(f"no row for {missing}; every client count needs both engines")
    head = ["clients"]
    for e in (base, other):
        head += [f"{e} tok/s", f"{e} TTFT p50", f"{e} TTFT p95", f"{e} ITL p95", f"{e} failed"]
    head += ["tok/s ratio", "TTFT p95 ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for n in counts:
        cells = [str(n)]
        for e in (base, other):
            r = by_key[(e, n)]
            cells += [
                f"{r['out_tok_per_s']:.1f}",
                f"{r['ttft_p50_ms']:.0f}",
                f"{r['ttft_p95_ms']:.0f}",
                f"{r['itl_p95_ms']:.1f}",
                str(r["failed"]),
            ]
        b, o = by_key[(base, n)], by_key[(other, n)]
        cells.append(f"{ratio(b['out_tok_per_s'], o['out_tok_per_s']):.2f}x")
        cells.append(f"{ratio(b['ttft_p95_ms'], o['ttft_p95_ms']):.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def scaling_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per engine: aggregate tok/s of each client count against its smallest count."""
    lines = []
    for engine in dict.fromkeys(r["engine"] for r in rows):
        own = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["clients"])
        first = own[0]
        for r in own[1:]:
            x = ratio(r["out_tok_per_s"], first["out_tok_per_s"])
            lines.append(
                f"{engine}: aggregate tok/s, {r['clients']} clients vs {first['clients']}: {x:.2f}x"
            )
    return lines
