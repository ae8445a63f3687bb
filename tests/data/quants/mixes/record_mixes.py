"""Records llama-quantize's per-tensor type choices for a model file as JSON (no tensor data).

Run: ``python record_mixes.py LLAMA_QUANTIZE IN.gguf OUT.json LABEL [--pure]``. For each
file type of :data:`FTYPES` it runs ``llama-quantize --dry-run --allow-requantize IN.gguf
FTYPE 1`` (and, given ``--pure``, the same with ``--pure``) and reads the type each tensor
gets from its log. The JSON keeps what the choice depends on: the metadata keys it reads and each
tensor's name, shape (numpy order, as tessera reads it) and stored type, in file order.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import gguf

FTYPES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
    "MXFP4_MOE", "F16", "BF16", "F32",
]  # fmt: skip
#: Metadata the choice reads, by the key's suffix after ``{arch}.``.
KEYS = ["block_count", "attention.head_count", "attention.head_count_kv", "expert_count"]
#: ``[   3/  56] blk.0.attn_k.weight - [ 256, 128, 1, 1], type = f16, size = ... (q4_K)``
LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*?\], type =\s*(\w+),.*?(?:\((\w+)\))?$")
TYPE_NAMES = {t.name.lower(): t.name for t in gguf.GGMLQuantizationType}


def choices(binary: str, path: str, ftype: str, pure: bool) -> dict[str, str]:
    cmd = [binary, "--dry-run", "--allow-requantize", *(["--pure"] if pure else [])]
    log = subprocess.run([*cmd, path, ftype, "1"], capture_output=True, text=True, check=True)
    found = {}
    for line in (log.stdout + log.stderr).splitlines():
        if m := LINE.match(line.strip()):
            found[m[1]] = TYPE_NAMES[(m[3] or m[2]).lower()]
    return found


def main() -> None:
    binary, path, out, label = sys.argv[1:5]
    with_pure = sys.argv[5:] == ["--pure"]
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    metadata = {"general.architecture": arch}
    for key in KEYS:
        if f"{arch}.{key}" in reader.fields:
            metadata[f"{arch}.{key}"] = reader.fields[f"{arch}.{key}"].contents()
    names = [t.name for t in reader.tensors]
    record = {
        "model": label,
        "metadata": metadata,
        "names": names,
        "shapes": [[int(n) for n in reversed(t.shape)] for t in reader.tensors],
        "stored": [t.tensor_type.name for t in reader.tensors],
        "mixes": {},
        **({"pure": {}} if with_pure else {}),
    }
    for ftype in FTYPES:
        for pure, key in ((False, "mixes"), (True, "pure"))[: 1 + with_pure]:
            got = choices(binary, path, ftype, pure)
            assert set(got) == set(names), f"{ftype}: the log did not name every tensor"
            record[key][ftype] = [got[n] for n in names]
    with open(out, "w", encoding="utf-8") as f:
        f.write("{\n")
        items = list(record.items())
        for i, (key, value) in enumerate(items):
            end = ",\n" if i < len(items) - 1 else "\n"
            if key in ("mixes", "pure"):  # one line per file type
                rows = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
                f.write(f"  {json.dumps(key)}: {{\n{rows}\n  }}{end}")
            else:
                f.write(f"  {json.dumps(key)}: {json.dumps(value)}{end}")
        f.write("}\n")


if __name__ == "__main__":
    main()
