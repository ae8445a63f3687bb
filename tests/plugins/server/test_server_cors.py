"""CORS as llama-server answers it (--cors-origins * by default, the Origin echoed with
credentials; localhost; a list; preflight OPTIONS before the API key), API keys in
``Authorization: Bearer`` or ``X-Api-Key`` (several, or from a file), and several --host
addresses, one of them a UNIX socket."""

from __future__ import annotations

import json
import socket

import pytest

from tessera.plugins.server.testing import call, live_server

ARGV = ["--backend", "numpy", "-np", "1", "-c", "128"]
PREFLIGHT = {
    "Origin": "https://app.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type,authorization",
}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# team keys\nfrom-file\n\n", encoding="utf-8")
    argv = [*ARGV, "--api-key", "k1,k2", "--api-key-file", str(keys)]
    with live_server(argv) as srv:
        yield srv


def test_by_default_any_origin_is_echoed_with_credentials(keyed):
    answer = call(keyed.v1 + "/models", headers={"Origin": "https://app.example",
                                                 "X-Api-Key": "k1"})  # fmt: skip
    assert answer.status == 200
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    assert answer.headers["access-control-allow-credentials"] == "true"
    assert "Origin" in answer.headers["vary"]
    # refusals carry the headers too, so the page can read why
    refused = call(keyed.v1 + "/models", headers={"Origin": "https://app.example"})
    assert refused.status == 401
    assert refused.headers["access-control-allow-origin"] == "https://app.example"


def test_a_preflight_is_answered_before_routing_and_the_key(keyed):
    for route in ("/v1/chat/completions", "/completion", "/no/such/route"):
        answer = call(keyed.url + route, None, method="OPTIONS", headers=PREFLIGHT)
        assert answer.status == 200 and answer.raw == b"", route
        h = answer.headers
        assert h["access-control-allow-origin"] == "https://app.example"
        assert h["access-control-allow-credentials"] == "true"
        assert h["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        # * with credentials: the headers the page asks for are named
        assert h["access-control-allow-headers"] == "content-type,authorization"


def test_api_keys_in_either_header_from_the_flag_or_the_file(keyed):
    url = keyed.v1 + "/models"
    for headers in ({"Authorization": "Bearer k1"}, {"X-Api-Key": "k2"},
                    {"authorization": "bearer from-file"}):  # fmt: skip
        assert call(url, headers=headers).status == 200, headers
    for headers in ({}, {"X-Api-Key": "k3"}, {"Authorization": "k1"},
                    {"Authorization": "Bearer # team keys"}):  # fmt: skip
        answer = call(url, headers=headers)
        assert answer.status == 401 and answer.json["error"]["code"] == "invalid_api_key"
    assert call(keyed.url + "/health").status == 200


@pytest.mark.parametrize(
    ("origins", "allowed", "refused"),
    [
        ("localhost", ["http://localhost:5173", "http://127.0.0.1", "http://[::1]:8000"],
         ["https://evil.example", "http://localhost.evil.example"]),
        ("https://a.example, https://b.example", ["https://b.example"],
         ["https://c.example", "https://a.example.evil"]),
    ],
)  # fmt: skip
def test_cors_origins_localhost_or_a_list(origins, allowed, refused):
    with live_server([*ARGV, "--cors-origins", origins]) as srv:
        for origin in allowed:
            answer = call(srv.url + "/health", headers={"Origin": origin})
            assert answer.headers.get("access-control-allow-origin") == origin
        for origin in refused:
            answer = call(srv.url + "/health", headers={"Origin": origin})
            assert "access-control-allow-origin" not in answer.headers, origin
            pre = call(srv.url + "/health", None, "OPTIONS", {**PREFLIGHT, "Origin": origin})
            assert pre.status == 200 and "access-control-allow-origin" not in pre.headers


def test_without_credentials_the_origin_is_a_star():
    with live_server([*ARGV, "--no-cors-credentials", "--cors-headers", "Content-Type"]) as srv:
        answer = call(srv.url + "/health", headers={"Origin": "https://app.example"})
        assert answer.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in answer.headers
        pre = call(srv.url + "/health", None, method="OPTIONS", headers=PREFLIGHT)
        assert pre.headers["access-control-allow-credentials"] == "false"
        assert pre.headers["access-control-allow-headers"] == "Content-Type"


def _unix_get(path: str, route: str) -> tuple[int, dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(f"GET {route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_several_hosts_one_port_and_a_unix_socket(tmp_path):
    sock = tmp_path / "tessera.sock"
    with live_server(ARGV, host=f"127.0.0.1,127.0.0.2,{sock}") as srv:
        first, second, unix = srv.urls
        assert first.rsplit(":", 1)[1] == second.rsplit(":", 1)[1]  # one port
        assert "127.0.0.2" in second and unix == f"unix:{sock}"
        for url in (first, second):
            assert call(url + "/health").json == {"status": "ok"}
        assert _unix_get(str(sock), "/health") == (200, {"status": "ok"})
