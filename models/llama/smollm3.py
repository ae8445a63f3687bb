"""SmolLM3 (HF ``smollm3``, GGUF ``smollm3``): Llama whose every fourth layer runs without
RoPE (NoPE). transformers lists the layers (``no_rope_layers``, 1 = RoPE); llama.cpp fixes
the step at 4 and stores nothing, so a checkpoint with another pattern loads from its HF
folder but cannot be written as GGUF.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import LlamaConfig, nope_layers

TESSERA_PLUGIN_API = 2
#: llama.cpp's ``n_no_rope_layer_step`` for smollm3.
NOPE_STEP = 4


class SmolLM3Architecture(LlamaArchitecture):
    names = ("smollm3",)
    hf_model_types = ("smollm3",)

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        if hf.get("use_sliding_window"):
            raise ModelFileError(
                "this SmolLM3 checkpoint enables sliding-window attention, which llama.cpp's "
                "smollm3 (and tessera) does not run; use a checkpoint without it"
            )
        interval = int(hf.get("no_rope_layer_interval") or NOPE_STEP)
        n_layer = fields["n_layer"]
        uses_rope = hf.get("no_rope_layers") or [
            int((il + 1) % interval != 0) for il in range(n_layer)
        ]
        return {"nope_layers": tuple(il for il, rope in enumerate(uses_rope) if not rope)}

    def gguf_metadata(self, c: LlamaConfig) -> dict[str, Any]:
        if c.nope_layers != nope_layers(NOPE_STEP, c.n_layer):
            raise ModelFileError(
                f"this SmolLM3 model has no RoPE in layers {list(c.nope_layers)}, but a "
                f"smollm3 GGUF file cannot say so (llama.cpp drops RoPE in every {NOPE_STEP}th "
                "layer); load the HF folder instead of converting it"
            )
        return super().gguf_metadata(c)


@hookimpl
def tessera_register_architectures(register):
    register(SmolLM3Architecture())
