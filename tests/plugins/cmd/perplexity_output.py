"""Reads the numbers out of llama-perplexity's (and ``tessera perplexity``'s) printed output.

Used by the perplexity tests and by ``tests/data/perplexity/record_llama_cpp.py``, so the
recorded llama.cpp numbers and tessera's are read the same way.
"""

from __future__ import annotations

import re

RUNNING = re.compile(r"\[(\d+)\](-?[\d.]+|nan|inf),")
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
#: ``Mean    KLD:   0.000129 ±   0.000009``, ``99.9%   Δp:  0.646%``, ``Cor(...): 99.91%``
STAT = re.compile(
    r"^(?P<label>.*?)\s*:\s*(?P<value>-?[\d.]+)\s*%?(?:\s*±\s*(?P<unc>[\d.]+))?\s*%?$"
)
NUMBER = re.compile(r"-?(?:\d+(?:\.\d+)?|nan|inf)")


def running_estimates(text: str) -> list[float]:
    """The ``[1]x,[2]y,...`` values in chunk order."""
    found = [(int(i), float(v)) for i, v in RUNNING.findall(text)]
    assert [i for i, _ in found] == list(range(1, len(found) + 1)), found
    return [v for _, v in found]


def final_estimate(text: str) -> tuple[float, float]:
    """``(PPL, uncertainty)`` of the ``Final estimate`` line."""
    m = FINAL.search(text)
    assert m, f"no final estimate in {text!r}"
    return float(m[1]), float(m[2])


def kld_statistics(text: str) -> dict[str, list[float]]:
    """Each statistics line of a --kl-divergence run as ``label: [value]`` or
    ``[value, uncertainty]``; labels with their spaces collapsed (``"Mean KLD"``,
    ``"99.9% KLD"``, ``"Same top p"``). Percent lines keep the printed percent."""
    stats = {}
    for line in text.splitlines():
        if line.startswith("=") or line.startswith("chunk"):
            continue
        m = STAT.match(line.strip())
        if m and not line[:4].strip().isdigit():
            values = [float(m["value"])] + ([float(m["unc"])] if m["unc"] else [])
            stats[" ".join(m["label"].split())] = values
    return stats


def kld_chunks(text: str) -> list[list[float]]:
    """Per chunk: number, PPL, ±, ln ratio, ±, KLD, ±, Δp RMS %, ±, same top %, ±."""
    rows = []
    for line in text.splitlines():
        if line[:4].strip().isdigit() and "±" in line:
            rows.append([float(x) for x in NUMBER.findall(line)])
    return rows
