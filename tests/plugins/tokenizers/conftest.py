"""The tokenizer kinds are checked on llama.cpp's vocabularies with the core tokenizer's
test-data reader (tests/core/text/tokenizer_vectors.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core" / "text"))
