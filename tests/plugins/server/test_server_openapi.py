"""/openapi.json describes the server truthfully: schemathesis generates bodies from it —
conforming ones and ones that break it — and every answer must be documented (status,
content type, response schema), never a 5xx, and every body that breaks the schema must be
refused with a 4xx. Loopback only, bounded examples."""

from __future__ import annotations

import json
import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tessera.plugins.server.testing import live_server, write_fim_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with slot files and POST /props on, whose queue takes every choice of a
    request (n <= 16) and whose answers stop after 4 tokens (--max-tokens-cap), so each
    example is quick; its model names FIM tokens, so /infill runs too."""
    model = write_fim_model(tmp_path_factory.mktemp("model") / "fim.gguf")
    argv = ["-m", str(model), "--backend", "numpy", "-np", "2", "-c", "256", "-b", "64"]
    argv += ["--max-queue", "64"]
    argv += ["--slot-save-path", str(tmp_path_factory.mktemp("slots")), "--props"]
    with live_server([*argv, "--max-tokens-cap", "4", "--pooling", "mean"]) as srv:
        yield srv


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def _document(server) -> dict:
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=30) as r:
        assert r.headers["content-type"].startswith("application/json")
        return json.loads(r.read())


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_dict(_document(server))


def test_the_document_lists_the_api_with_the_declared_fields(server):
    doc = _document(server)
    assert doc["openapi"].startswith("3.1")
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    props = chat["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["required"] == ["messages"]
    temperature = props["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    assert props["repeat_penalty"]["anyOf"][0]["exclusiveMinimum"] == 0
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert {"/v1/embeddings", "/tokenize", "/slots/{id_slot}", "/health"} <= set(doc["paths"])
    # with no API key, nothing asks for one
    assert "security" not in chat


def _operations(schema):
    """One operation per route and handler: a path without /v1 whose /v1 twin is the same
    operation (an alias) is skipped; /completions and /embeddings are llama-server's own
    routes, not aliases, and stay."""

    def same(op) -> tuple:
        return op.method, {k: v for k, v in op.definition.raw.items() if k != "operationId"}

    ops = [result.ok() for result in schema.get_all_operations()]
    by_path = {(op.path, op.method): op for op in ops}
    return [
        op
        for op in ops
        if op.path.startswith("/v1")
        or (twin := by_path.get(("/v1" + op.path, op.method))) is None
        or same(twin) != same(op)
    ]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_keeps_to_its_document(schema, server, mode):
    operations = _operations(schema)
    assert len(operations) >= 10
    for op in operations:
        if mode is GenerationMode.NEGATIVE and "requestBody" not in op.definition.raw:
            continue  # nothing to break in a bodiless GET

        @settings(
            max_examples=25,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(mode))
        def run(case):
            case.call_and_validate(base_url=server.url, checks=CHECKS)

        run()
    # and the server still answers a normal request
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    req = urllib.request.Request(
        server.v1 + "/completions", body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["choices"]
