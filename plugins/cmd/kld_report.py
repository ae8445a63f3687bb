"""The text ``tessera perplexity --kl-divergence`` prints, in llama-perplexity's layout.

One line per chunk with the running values, then (from 100 scored tokens on, as
llama.cpp) the perplexity, KL-divergence and token-probability statistics.
"""

from __future__ import annotations

import math

import numpy as np

from tessera.plugins.cmd.kld_stats import KLDivergence, median, percentile

CHUNK_HEADER = (
    "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
    "              Δp RMS            Same top p"
)
#: llama.cpp does no statistics on fewer scored tokens than this.
MIN_COUNT_FOR_STATISTICS = 100
KLD_PERCENTILES = (
    ("99.9%", 0.999),
    ("99.0%", 0.990),
    ("95.0%", 0.950),
    ("90.0%", 0.900),
    ("Median", None),
    ("10.0%", 0.100),
    (" 5.0%", 0.050),
    (" 1.0%", 0.010),
    (" 0.1%", 0.001),
)
P_DIFF_PERCENTILES = (
    *KLD_PERCENTILES[:4],
    ("75.0%", 0.750),
    ("Median", None),
    ("25.0%", 0.250),
    *KLD_PERCENTILES[5:],
)


def chunk_line(index: int, kld: KLDivergence) -> str:
    """The running values after chunk ``index`` (one-based)."""
    log_ppl, dlog_ppl = kld.log_ppl()
    ppl = math.exp(log_ppl)
    ratio, dratio = kld.log_ppl_ratio()
    mean_kld, dkld = kld.kld()
    rms, drms = kld.p_diff_rms()
    top, dtop = kld.same_top()
    return (
        f"{index:4d}    {ppl:9.4f} ± {ppl * dlog_ppl:9.4f}    {ratio:10.5f} ± {dratio:10.5f}"
        f"    {mean_kld:10.5f} ± {dkld:10.5f}    {100 * rms:6.3f} ± {100 * drms:6.3f} %"
        f"    {100 * top:6.3f} ± {100 * dtop:6.3f} %"
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def perplexity_lines(kld: KLDivergence) -> list[str]:
    log_ppl, dlog_ppl = kld.log_ppl()
    log_base, dlog_base = kld.log_ppl_base()
    ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
    dppl, dppl_base = ppl * dlog_ppl, ppl_base * dlog_base
    cov = kld.log_ppl_cov()
    ratio, dratio = kld.log_ppl_ratio()
    diff_var = dppl * dppl + dppl_base * dppl_base - 2.0 * ppl * ppl_base * cov
    ppl_ratio, ppl_diff = math.exp(ratio), ppl - ppl_base
    dppl_diff = math.sqrt(max(diff_var, 0.0))
    return [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {ppl:10.6f} ± {dppl:10.6f}",
        f"Mean PPL(base)                : {ppl_base:10.6f} ± {dppl_base:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * _ratio(cov, dlog_ppl * dlog_base):6.2f}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {dratio:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {ppl_ratio:10.6f} ± {ppl_ratio * dratio:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {ppl_diff:10.6f} ± {dppl_diff:10.6f}",
    ]


def _percentile_lines(values: np.ndarray, rows, unit: str, fmt) -> list[str]:
    lines = [f"Maximum {unit}: {fmt(float(values[-1]))}"]
    for label, fraction in rows:
        value = median(values) if fraction is None else percentile(values, fraction)
        lines.append(f"{label:<7} {unit}: {fmt(value)}")
    lines.append(f"Minimum {unit}: {fmt(float(values[0]))}")
    return lines


def kld_lines(kld: KLDivergence) -> list[str]:
    mean, dmean = kld.kld()
    values = kld.sorted_kld()
    return [
        "====== KL divergence statistics ======",
        f"Mean    KLD: {mean:10.6f} ± {dmean:10.6f}",
        *_percentile_lines(values, KLD_PERCENTILES, "KLD", lambda v: f"{v:10.6f}"),
    ]


def token_probability_lines(kld: KLDivergence) -> list[str]:
    mean, dmean = kld.p_diff()
    values = kld.sorted_p_diff()
    rms, drms = kld.p_diff_rms()
    top, dtop = kld.same_top()
    return [
        "====== Token probability statistics ======",
        f"Mean    Δp: {100 * mean:6.3f} ± {100 * dmean:5.3f} %",
        *_percentile_lines(values, P_DIFF_PERCENTILES, "Δp", lambda v: f"{100 * v:6.3f}%"),
        f"RMS Δp    : {100 * rms:6.3f} ± {100 * drms:5.3f} %",
        f"Same top p: {100 * top:6.3f} ± {100 * dtop:5.3f} %",
    ]


def summary_lines(kld: KLDivergence) -> list[str]:
    """The three statistics sections; empty below :data:`MIN_COUNT_FOR_STATISTICS`."""
    if kld.count < MIN_COUNT_FOR_STATISTICS:
        return []
    return [*perplexity_lines(kld), "", *kld_lines(kld), "", *token_probability_lines(kld)]
