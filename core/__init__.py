"""tessera: an LLM inference runtime built as a small core plus plugins.

The core holds the hook specs (:mod:`tessera.hookspecs`), the plugin manager, loading,
tokenizer, KV cache, batching, sampling and the engine. Every feature — backends,
architectures, quantization types, CLI commands — is a plugin found through the
``tessera`` entry-point group. :class:`tessera.LLM` (``from tessera import LLM``) is the
Python API: a model loaded in a program, answering with OpenAI-shaped dicts.
"""

from typing import Any

__all__ = ["LLM", "PLUGIN_API_VERSION", "__version__"]

__version__ = "0.1.0"

#: Version of the plugin API. A plugin module declares the version it was written for as
#: ``TESSERA_PLUGIN_API = 2``; the loader refuses a plugin whose major version differs.
PLUGIN_API_VERSION = 2


def __getattr__(name: str) -> Any:
    # LLM loads lazily: ``import tessera`` (every command, ``tessera plugins``) stays light
    if name == "LLM":
        from tessera.llm import LLM

        return LLM
    raise AttributeError(f"module 'tessera' has no attribute '{name}'")
