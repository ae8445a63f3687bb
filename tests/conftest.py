"""Test-wide settings: strict plugin loading, and no network or progress noise from HF."""

import os

# A built-in plugin that fails to load must fail the tests, not be skipped quietly.
os.environ.setdefault("TESSERA_STRICT_PLUGINS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
