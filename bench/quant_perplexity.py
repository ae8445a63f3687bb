"""Perplexity and KL divergence of every ``tessera quantize`` file type (docs/quant-types.md).

    .venv/bin/python bench/quant_perplexity.py [--model F16.gguf] [--text FILE] [--work DIR]

Quantizes the model (default: the bundled F16 one) to each file type whose quant types are
installed, then runs, as a user would:

    tessera perplexity -m F16.gguf -f TEXT --kl-divergence-base F16.kld
    tessera perplexity -m TYPE.gguf -f TEXT
    tessera perplexity -m TYPE.gguf --kl-divergence-base F16.kld --kl-divergence

(llama-perplexity's default -c 512; torch backend, f32) and prints one markdown row per type:
file size, PPL with its uncertainty, ln(PPL(Q)/PPL(F16)), mean KLD vs F16, same top p. The
text defaults to tests/data/perplexity/python-notes.txt (5 chunks of 512 tokens).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tessera.errors import TesseraError
from tessera.files.load import default_model_path
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model
from tessera.plugins.cmd.quantize_types import FILE_TYPES

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "data" / "perplexity" / "python-notes.txt"
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")


def perplexity(*args: str) -> str:
    cmd = [sys.executable, "-m", "tessera", "perplexity", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def statistic(out: str, label: str) -> str:
    """The value (and ``± uncertainty``) after ``label:`` in a --kl-divergence output."""
    m = re.search(rf"^{re.escape(label)}\s*:\s*(.+)$", out, re.MULTILINE)
    return " ".join(m[1].split()) if m else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="F16 GGUF (default: bundled model)")
    parser.add_argument("--text", default=str(TEXT), help="text to score")
    parser.add_argument("--work", default=None, help="folder for the files (default: a temp one)")
    args = parser.parse_args()
    runtime = Runtime()
    src = Path(args.model or default_model_path())
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        base = Path(tmp) / "base.kld"
        perplexity("-m", str(src), "-f", args.text, "--kl-divergence-base", str(base))
        print("| file type | MiB | PPL | ln(PPL(Q)/PPL(F16)) | mean KLD vs F16 | same top p |")
        print("|---|---:|---:|---:|---:|---:|")
        for target in FILE_TYPES:
            out = Path(tmp) / f"{target}.gguf"
            try:
                quantize_model(src, out, target, runtime)
            except TesseraError as error:  # a quant type it needs is not installed
                print(f"| {target} | not measured: {error} |||||")
                continue
            ppl, err = FINAL.search(perplexity("-m", str(out), "-f", args.text)).groups()
            kld = perplexity("-m", str(out), "--kl-divergence-base", str(base), "--kl-divergence")
            print(
                f"| {target} | {out.stat().st_size / 2**20:.2f} | {ppl} ± {err} "
                f"| {statistic(kld, 'Mean ln(PPL(Q)/PPL(base))')} "
                f"| {statistic(kld, 'Mean    KLD')} | {statistic(kld, 'Same top p')} |",
                flush=True,
            )
            out.unlink()


if __name__ == "__main__":
    main()
