"""The access log: one line per request, text or JSON, with method, path, status, duration
and the tokens the answer's usage reports; no query string, no body; and the model summary
line when the server starts."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tessera.plugins.server.access_log import AccessLog, count_tokens
from tessera.plugins.server.testing import call, live_server

SECRET = "my secret prompt text"
TEXT_LINE = re.compile(
    r"^\S+Z (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d+|-) (?P<ms>[\d.]+) ms "
    r"tokens (?P<prompt>\d+)\+(?P<completion>\d+)$"
)


def _drive(app, path="/x", query=b"", body=b""):
    """One HTTP request through an ASGI app; the lines the log wrote."""
    lines: list[str] = []
    sent: list[dict] = []
    scope = {"type": "http", "method": "POST", "path": path, "query_string": query}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(AccessLog(app, "json", lines.append)(scope, receive, send))
    return lines, sent


def test_one_json_line_with_the_status_sent_and_the_tokens_counted():
    async def app(scope, receive, send):
        await receive()
        count_tokens(7, 3)
        await asyncio.gather(asyncio.sleep(0), _count_in_a_task())  # tasks add to it too
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def _count_in_a_task():
        count_tokens(1, 2)

    lines, sent = _drive(app, "/v1/things", b"api_key=k", SECRET.encode())
    assert len(lines) == 1 and sent[0]["status"] == 201
    record = json.loads(lines[0])
    assert set(record) == {
        "time", "method", "path", "status", "duration_ms", "prompt_tokens", "completion_tokens"
    }  # fmt: skip
    assert record["method"] == "POST" and record["path"] == "/v1/things"
    assert record["status"] == 201 and record["duration_ms"] >= 0
    assert (record["prompt_tokens"], record["completion_tokens"]) == (8, 5)
    assert SECRET not in lines[0] and "api_key" not in lines[0]


def test_a_request_that_fails_before_answering_still_has_its_line():
    async def app(scope, receive, send):
        raise RuntimeError("boom")

    lines: list[str] = []
    scope = {"type": "http", "method": "GET", "path": "/y"}

    async def run():
        await AccessLog(app, "text", lines.append)(scope, None, None)

    with pytest.raises(RuntimeError):
        asyncio.run(run())
    # the line is written before the error goes on; no status was sent
    match = TEXT_LINE.match(lines[0])
    assert match and match["status"] == "-" and match["path"] == "/y"


def test_off_writes_nothing():
    lines: list[str] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def run():
        await AccessLog(app, "off", lines.append)({"type": "http", "path": "/"}, None, _noop)

    async def _noop(message):
        pass

    asyncio.run(run())
    assert lines == []


def _records(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_the_server_logs_each_request_with_the_usage_it_answered(capsys):
    argv = ["--backend", "numpy", "-c", "256", "-np", "1", "--log-format", "json"]
    with live_server(argv) as srv:
        startup = capsys.readouterr().err
        done = call(srv.v1 + "/completions", {"prompt": SECRET, "max_tokens": 5, "temperature": 0})
        streamed = call(srv.v1 + "/completions", {"prompt": "Hi", "max_tokens": 3, "stream": True})
        missing = call(srv.url + "/no/such/route?key=value")
    err = capsys.readouterr().err  # once the server is down: a line follows its last byte
    assert "model: llama" in startup and "numpy/f32 on cpu" in startup  # the summary line
    assert done.status == 200 and streamed.status == 200 and missing.status == 404
    records = _records(err)
    by_path = {r["path"]: r for r in records}
    usage = done.json["usage"]
    first = [r for r in records if r["path"] == "/v1/completions"]
    assert len(first) == 2
    assert first[0]["method"] == "POST" and first[0]["status"] == 200
    assert first[0]["prompt_tokens"] == usage["prompt_tokens"]
    assert first[0]["completion_tokens"] == usage["completion_tokens"] == 5
    assert first[1]["completion_tokens"] == 3  # a stream's tokens are counted too
    assert first[0]["duration_ms"] > 0
    assert by_path["/no/such/route"]["status"] == 404
    assert SECRET not in err and "key=value" not in err


def test_the_text_format_has_the_same_fields(capsys):
    argv = ["--backend", "numpy", "-c", "256", "-np", "1", "--log-format", "text"]
    with live_server(argv) as srv:
        capsys.readouterr()
        done = call(srv.v1 + "/completions", {"prompt": "Hi", "max_tokens": 4})
    err = capsys.readouterr().err
    lines = [m for m in map(TEXT_LINE.match, err.splitlines()) if m]
    (line,) = [m for m in lines if m["path"] == "/v1/completions"]
    assert line["method"] == "POST" and line["status"] == "200" and float(line["ms"]) > 0
    assert int(line["prompt"]) == done.json["usage"]["prompt_tokens"]
    assert int(line["completion"]) == done.json["usage"]["completion_tokens"]


def test_text_is_the_commands_default_and_a_bad_format_is_refused(capsys):
    from tessera.cli.main import build_parser
    from tessera.plugin_manager import Runtime

    parser = build_parser(Runtime())
    assert parser.parse_args(["serve"]).log_format == "text"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--log-format", "xml"])
    assert exc.value.code == 2 and "--log-format" in capsys.readouterr().err
