"""Tools for testing tessera and its plugins: random-weight model files and conformance kits."""

from tessera.testing.models import make_gguf, make_hf_dir

__all__ = ["make_gguf", "make_hf_dir"]
