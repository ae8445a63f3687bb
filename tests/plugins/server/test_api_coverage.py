"""docs/server.md's API coverage tables against the field declarations and the live
server's /openapi.json: a field a handler checks is in the table, a route the table calls
supported is served."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tessera.plugins.server import api_coverage
from tessera.plugins.server.testing import live_server

DOC = Path(__file__).resolve().parents[3] / "docs" / "server.md"


@pytest.fixture(scope="module")
def openapi():
    with live_server(["--backend", "numpy", "-c", "128"]) as srv:
        yield httpx.get(srv.url + "/openapi.json", timeout=60).json()


def _bodies(openapi) -> dict[str, set[str]]:
    """ "METHOD /path" -> the request fields /openapi.json documents for it."""
    out = {}
    for path, ops in openapi["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody")
            if body is not None:
                schema = body["content"]["application/json"]["schema"]
                # an array body (POST /lora-adapters' list) has no named fields
                out[f"{method.upper()} {path}"] = set(schema.get("properties", {}))
    return out


def test_the_document_holds_the_tables_the_declarations_make():
    text = DOC.read_text(encoding="utf-8")
    assert api_coverage.with_tables(text) == text, (
        "docs/server.md's API tables are out of date with plugins/server/api_fields*.py; "
        "run: python -m tessera.plugins.server.api_coverage docs/server.md"
    )


def test_every_declared_field_is_a_row_of_the_fields_table():
    table = api_coverage.fields_table()
    for route, declared in api_coverage.ROUTE_FIELDS:
        for name in declared:
            assert f"| `{route}` | `{name}` |" in table


def test_the_declarations_are_what_openapi_documents(openapi):
    bodies = _bodies(openapi)
    tables = {route: set(declared) for route, declared in api_coverage.ROUTE_FIELDS}
    for route, fields in tables.items():
        if route.startswith("options of"):
            continue
        assert bodies[route] == fields, route
    # an alias route (/chat/completions, /v1/reranking ...) takes one of the tables
    for route, fields in bodies.items():
        assert fields in tables.values() or not fields, route
    options = openapi["paths"]["/api/chat"]["post"]["requestBody"]["content"]
    options = options["application/json"]["schema"]["properties"]["options"]
    assert set(options["anyOf"][0]["properties"]) == tables["options of /api/chat, /api/generate"]


def test_every_route_the_table_calls_supported_is_served(openapi):
    served = {f"{m.upper()} {p}" for p, ops in openapi["paths"].items() for m in ops}
    supported = [r for _, r, status in api_coverage.ROUTES if status.startswith("supported")]
    assert supported and all(route in served for route in supported), sorted(
        set(supported) - served
    )
    refused = [r for _, r, status in api_coverage.ROUTES if status.startswith("not served")]
    assert not served & set(refused)


def test_a_field_doc_that_says_ignored_is_not_called_supported():
    from tessera.plugins.server.api_fields_ollama import OLLAMA_OPTIONS

    assert api_coverage.field_status(OLLAMA_OPTIONS["num_ctx"]) == "ignored"
    assert api_coverage.field_status(OLLAMA_OPTIONS["typical_p"]) == "supported"
