"""Records llama-perplexity's numbers on the bundled model for the perplexity tests.

Run from the repository root (not in CI; it needs a llama.cpp build):

    .venv/bin/python tests/data/perplexity/record_llama_cpp.py LLAMA_BIN_DIR

It quantizes the bundled F16 model to Q8_0 and Q4_0 with ``tessera quantize``, then runs
llama-perplexity (``LLAMA_BIN_DIR/llama-perplexity``, 2 threads) for perplexity over
``python-notes.txt`` at ``-c 512`` and ``-c 32 --chunks 7``, the latter also writing the F16
model's KL-divergence base (``llama-f16-c32.kld``, kept here); ``tessera perplexity`` writes
base files of its own for F16, Q8_0 and Q4_0; llama-perplexity's ``--kl-divergence`` then
reads each model against llama.cpp's F16 base, tessera's F16 base and tessera's base of the
same weights. Everything printed is parsed into ``llama-perplexity.json`` with the commands.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "cmd"))

from perplexity_output import (  # noqa: E402
    final_estimate,
    kld_chunks,
    kld_statistics,
    running_estimates,
)

TEXT = HERE / "python-notes.txt"
MODEL = ROOT / "core" / "default_model" / "tessera-default.gguf"
BASE = HERE / "llama-f16-c32.kld"
KLD_ARGS = ["-c", "32", "--chunks", "7"]
TYPES = ("Q8_0", "Q4_0")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def run(cmd: list[str], done: str) -> str:
    """stdout of ``cmd``; retried when its output misses ``done`` (llama.cpp's logger
    sometimes loses the tail of stdout at exit)."""
    for _ in range(5):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        if done in out.stdout + out.stderr:
            return out.stdout + out.stderr
    raise RuntimeError(f"{cmd} never printed {done!r}")


def tensor_sha256(path: Path) -> str:
    """Hash of the tensors (names, types, bytes), not of the metadata order."""
    from gguf import GGUFReader

    h = hashlib.sha256()
    for t in GGUFReader(path).tensors:
        h.update(t.name.encode() + int(t.tensor_type).to_bytes(4, "little"))
        h.update(bytes(t.data))
    return h.hexdigest()


def main(bin_dir: str) -> None:
    ppl = str(Path(bin_dir) / "llama-perplexity")
    tessera = [sys.executable, "-m", "tessera"]
    version = subprocess.run([ppl, "--version"], capture_output=True, text=True).stderr
    record: dict = {
        "llama_cpp": " ".join(version.split()),
        "model": rel(MODEL),
        "text": TEXT.name,
        "perplexity": {},
        "quantized": {},
        "kl_divergence": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = {"F16": MODEL}
        for qtype in TYPES:
            models[qtype] = tmp / f"tessera-default-{qtype}.gguf"
            subprocess.run(
                [*tessera, "quantize", str(MODEL), str(models[qtype]), qtype], check=True
            )
            record["quantized"][qtype] = {"tensor_sha256": tensor_sha256(models[qtype])}
        for name, extra in (("c512", []), ("c32", [*KLD_ARGS, "--kl-divergence-base", str(BASE)])):
            args = ["-m", str(MODEL), "-f", str(TEXT), "-t", "2", *extra]
            out = run([ppl, *args], "Final estimate")
            value, err = final_estimate(out)
            record["perplexity"][name] = {
                "command": " ".join(["llama-perplexity", *map(_short, args)]),
                "running": running_estimates(out),
                "ppl": value,
                "uncertainty": err,
            }
        bases = {"llama_f16_base": BASE}
        for name, path in models.items():
            base = bases[f"tessera_{name}_base"] = tmp / f"tessera-{name}-c32.kld"
            cmd = ["perplexity", "-m", str(path), "-f", str(TEXT), *KLD_ARGS]
            cmd += ["--kl-divergence-base", str(base)]
            subprocess.run([*tessera, *cmd], check=True, capture_output=True)
        for name, path in models.items():
            runs = {}
            against = {
                "llama_f16_base": bases["llama_f16_base"],
                "tessera_f16_base": bases["tessera_F16_base"],
                "tessera_same_weights_base": bases[f"tessera_{name}_base"],
            }
            for label, base in against.items():
                args = ["-m", str(path), "-t", "2", "-c", "32", "-b", "32"]
                args += ["--kl-divergence-base", str(base), "--kl-divergence"]
                out = run([ppl, *args], "Same top p:")
                runs[label] = {
                    "command": " ".join(["llama-perplexity", *map(_short, args)]),
                    "chunks": kld_chunks(out),
                    "statistics": kld_statistics(out),
                }
            record["kl_divergence"][name] = runs
    text = json.dumps(record, indent=1, ensure_ascii=False)
    # lists of numbers on one line each: a chunk's row reads as llama.cpp printed it
    text = re.sub(r"\[\s*([-\d.e,\sNa]+?)\s*\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    (HERE / "llama-perplexity.json").write_text(text + "\n")
    print(f"wrote {rel(HERE / 'llama-perplexity.json')} and {rel(BASE)}")


def _short(arg: str) -> str:
    """Paths as the README names them: repository-relative, or the temporary file's name."""
    path = Path(arg)
    return rel(path) if path.is_absolute() else arg


if __name__ == "__main__":
    if len(sys.argv) != 2 or not shutil.which(str(Path(sys.argv[1]) / "llama-perplexity")):
        sys.exit(__doc__)
    main(sys.argv[1])
