"""A live server on the default model (numpy backend: the reference numbers) per module."""

from __future__ import annotations

import pytest

from tessera.plugins.server.testing import live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    argv = ["--backend", "numpy", "-np", "3", "-c", "512", "-b", "64"]
    argv += ["--slot-save-path", str(slots), "--max-queue", "2", "--pooling", "mean"]
    with live_server(argv) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
