"""The model files a multi-model server knows: what a models directory holds, what each
file is (architecture, quant type, context) without loading it, and the hidden/favourite
flags kept beside them.

A models directory holds GGUF files (``*.gguf``) and Hugging Face folders (a directory
with ``config.json``) at its top level. Names starting with ``.`` are never models: that
is where partial downloads (``.NAME.part``) and the flags file live.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from tessera.errors import TesseraError

#: The flags file in a models directory.
FLAGS_FILE = ".tessera-models.json"


@attrs.frozen
class ModelFileInfo:
    """What a model file says about itself (read from its header, not loaded)."""

    size: int
    arch: str = ""
    quant: str = ""
    n_ctx_train: int = 0
    error: str | None = None


def scan_models_dir(models_dir: Path) -> dict[str, Path]:
    """Model name -> path of every GGUF file and HF folder at the top of ``models_dir``."""
    found: dict[str, Path] = {}
    for path in sorted(models_dir.iterdir()):
        if path.name.startswith("."):
            continue
        if (path.is_file() and path.suffix == ".gguf") or (
            path.is_dir() and (path / "config.json").is_file()
        ):
            found[path.name] = path
    return found


def _disk_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _dominant_type(tensors: Iterable[Any]) -> str:
    """The GGML type holding most of the weights' elements (what llama.cpp calls the quant)."""
    import gguf

    count: collections.Counter[int] = collections.Counter()
    for t in tensors:
        if len(t.shape) >= 2:  # norms and biases stay f32 in every quantized file
            count[t.ggml_type] += t.n_elements
    if not count:
        return ""
    ggml_type = count.most_common(1)[0][0]
    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def inspect_model(path: Path) -> ModelFileInfo:
    """Size, architecture, quant type and training context of a GGUF file or HF folder;
    a file that cannot be read gets ``error`` set instead of raising."""
    size = _disk_size(path)
    try:
        if path.is_dir():
            from tessera.files.hf import read_hf_config

            config = read_hf_config(path)
            dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
            return ModelFileInfo(
                size,
                str(config["model_type"]),
                dtype.upper().replace("FLOAT", "F"),  # float32 -> F32, bfloat16 -> BF16
                int(config.get("max_position_embeddings") or 0),
            )
        from tessera.files.gguf import read_gguf

        gguf_file = read_gguf(path)
        arch = gguf_file.architecture
        n_ctx = int(gguf_file.metadata.get(f"{arch}.context_length", 0) or 0)
        return ModelFileInfo(size, arch, _dominant_type(gguf_file.tensors.values()), n_ctx)
    except (TesseraError, OSError, ValueError, KeyError) as exc:
        return ModelFileInfo(size, error=str(exc))


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to a temporary file beside ``path``, then rename it over."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@attrs.define
class ModelFlags:
    """Hidden and favourite model names, saved in ``FLAGS_FILE`` of the models directory
    (kept in memory only when there is none)."""

    path: Path | None
    hidden: set[str] = attrs.field(factory=set)
    favourite: set[str] = attrs.field(factory=set)

    @classmethod
    def load(cls, models_dir: Path | None) -> ModelFlags:
        if models_dir is None:
            return cls(None)
        path = models_dir / FLAGS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise TesseraError(
                f"'{path}' is not a valid flags file ({exc}); fix or delete it"
            ) from None
        return cls(path, set(data.get("hidden", [])), set(data.get("favourite", [])))

    def set(self, kind: str, name: str, on: bool) -> None:
        """Turn flag ``kind`` ("hidden" or "favourite") of ``name`` on or off; save."""
        names: set[str] = getattr(self, kind)
        if on:
            names.add(name)
        else:
            names.discard(name)
        self.save()

    def forget(self, name: str) -> None:
        """Drop a deleted model's flags."""
        if name in self.hidden or name in self.favourite:
            self.hidden.discard(name)
            self.favourite.discard(name)
            self.save()

    def save(self) -> None:
        if self.path is not None:
            data = {"hidden": sorted(self.hidden), "favourite": sorted(self.favourite)}
            write_json_atomic(self.path, data)
