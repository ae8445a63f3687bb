"""Downloads into the models directory: resume with HTTP Range after a broken transfer
gives the exact bytes, a bad checksum is refused and removed, the file appears in the
registry only when complete, pause, resume and cancel."""

from __future__ import annotations

import hashlib
import socket

import pytest
from conftest import call, rows, wait_for

from tessera.plugins.server.testing import live_server
from tessera.testing.http_files import file_server


@pytest.fixture
def dl_server(tmp_path, model_sources):
    d = tmp_path / "models"
    d.mkdir()
    argv = ["--backend", "numpy", "--models-dir", str(d), "-c", "128", "-np", "1", "-b", "64"]
    with live_server(argv) as srv:
        yield srv, d


@pytest.fixture
def files(model_sources):
    data = model_sources["gamma.gguf"].read_bytes()
    with file_server({"remote.gguf": data}) as (base, control):
        yield base, control, data


def _state(srv, download_id: str, *states: str) -> dict:
    def current():
        for d in call(srv.url + "/api/downloads")[1]["downloads"]:
            if d["id"] == download_id and d["state"] in states:
                return d
        return None

    return wait_for(current, what=f"download {download_id} to be {'/'.join(states)}")


def test_download_with_checksum_appears_complete_and_loads(dl_server, files):
    (srv, models_dir), (base, _, data) = dl_server, files
    sha = hashlib.sha256(data).hexdigest()
    status, d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf", "sha256": sha})
    assert status == 202 and d["filename"] == "remote.gguf"
    done = _state(srv, d["id"], "done")
    assert done["done_bytes"] == done["total_bytes"] == len(data)
    assert (models_dir / "remote.gguf").read_bytes() == data
    assert not (models_dir / ".remote.gguf.part").exists()
    assert rows(srv)["remote.gguf"]["state"] == "on_disk"
    body = {"model": "remote.gguf", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert call(srv.v1 + "/chat/completions", body)[0] == 200


def test_interrupted_download_resumes_with_range_to_the_exact_bytes(dl_server, files):
    (srv, models_dir), (base, control, data) = dl_server, files
    cut = len(data) * 2 // 5 + 123
    control.cut_at["remote.gguf"] = cut
    status, d = call(
        srv.url + "/api/downloads", {"url": base + "/remote.gguf", "filename": "x.gguf"}
    )
    assert status == 202
    broken = _state(srv, d["id"], "interrupted")
    assert broken["done_bytes"] == cut and broken["total_bytes"] == len(data)
    assert "resume" in broken["error"]
    assert (models_dir / ".x.gguf.part").stat().st_size == cut
    assert not (models_dir / "x.gguf").exists()
    assert "x.gguf" not in rows(srv) and ".x.gguf.part" not in rows(srv)
    status, _ = call(srv.url + "/api/downloads/resume", {"id": d["id"]})
    assert status == 200
    _state(srv, d["id"], "done")
    assert (models_dir / "x.gguf").read_bytes() == data
    assert control.requests == [("/remote.gguf", None), ("/remote.gguf", f"bytes={cut}-")]
    assert "x.gguf" in rows(srv)


def test_a_server_ignoring_range_restarts_from_zero(dl_server, files):
    (srv, models_dir), (base, control, data) = dl_server, files
    control.cut_at["remote.gguf"] = 50_000
    d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf"})[1]
    _state(srv, d["id"], "interrupted")
    control.ignore_range = True
    call(srv.url + "/api/downloads/resume", {"id": d["id"]})
    _state(srv, d["id"], "done")
    assert (models_dir / "remote.gguf").read_bytes() == data


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_download_that_never_connects_fails_and_says_so(dl_server):
    srv, models_dir = dl_server
    url = f"http://127.0.0.1:{_closed_port()}/remote.gguf"
    d = call(srv.url + "/api/downloads", {"url": url})[1]
    failed = _state(srv, d["id"], "failed", "interrupted")
    assert failed["state"] == "failed" and failed["done_bytes"] == 0
    assert "could not connect to 127.0.0.1" in failed["error"]
    assert "interrupted" not in failed["error"] and "resume" not in failed["error"]
    assert list(models_dir.iterdir()) == []


def test_a_broken_download_whose_server_went_away_stays_resumable(dl_server, model_sources):
    srv, models_dir = dl_server
    data = model_sources["gamma.gguf"].read_bytes()
    with file_server({"remote.gguf": data}) as (base, control):
        control.cut_at["remote.gguf"] = 40_000
        d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf"})[1]
        _state(srv, d["id"], "interrupted")
    call(srv.url + "/api/downloads/resume", {"id": d["id"]})  # the file server is gone
    again = _state(srv, d["id"], "interrupted")
    assert again["error"].startswith("could not reconnect") and "resume" in again["error"]
    assert (models_dir / ".remote.gguf.part").stat().st_size == 40_000


def test_bad_checksum_is_rejected_and_removed(dl_server, files):
    (srv, models_dir), (base, _, _) = dl_server, files
    wrong = "0" * 64
    d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf", "sha256": wrong})[1]
    failed = _state(srv, d["id"], "failed")
    assert "checksum mismatch" in failed["error"] and "removed" in failed["error"]
    assert list(models_dir.iterdir()) == []
    assert "remote.gguf" not in rows(srv)


def test_pause_resume_and_cancel(dl_server, files):
    (srv, models_dir), (base, control, data) = dl_server, files
    control.delay_s = 0.02  # ~0.8 MiB/s: slow enough to pause midway
    d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf"})[1]
    wait_for(lambda: _state(srv, d["id"], "downloading")["done_bytes"] > 0, what="progress")
    status, paused = call(srv.url + "/api/downloads/pause", {"id": d["id"]})
    assert status == 200 and paused["state"] == "paused"
    part = models_dir / ".remote.gguf.part"
    assert 0 < part.stat().st_size < len(data)
    control.delay_s = 0.0
    assert call(srv.url + "/api/downloads/resume", {"id": d["id"]})[0] == 200
    _state(srv, d["id"], "done")
    assert (models_dir / "remote.gguf").read_bytes() == data
    assert control.requests[-1][1] is not None  # the resume asked for a range

    control.delay_s = 0.02
    call(srv.url + "/api/models/delete", {"model": "remote.gguf"})
    d = call(srv.url + "/api/downloads", {"url": base + "/remote.gguf"})[1]
    wait_for(lambda: part.exists() and part.stat().st_size > 0, what="a partial file")
    status, cancelled = call(srv.url + "/api/downloads/cancel", {"id": d["id"]})
    assert status == 200 and cancelled["state"] == "cancelled"
    assert not part.exists() and not (models_dir / "remote.gguf").exists()
    status, body = call(srv.url + "/api/downloads/resume", {"id": d["id"]})
    assert status == 409 and "cancelled" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"url": "file:///etc/passwd"}, 400, "http:// or https://"),
        ({"url": "ftp://host/x.gguf"}, 400, "http:// or https://"),
        ({"url": "http://h/x.gguf", "filename": "../evil.gguf"}, 400, "invalid file name"),
        ({"url": "http://h/x.gguf", "filename": "sub/evil.gguf"}, 400, "invalid file name"),
        ({"url": "http://h/x.gguf", "filename": "/tmp/evil.gguf"}, 400, "invalid file name"),
        ({"url": "http://h/x.gguf", "filename": "evil.sh"}, 400, "ending in .gguf"),
        ({"url": "http://h/..%2F..%2Fevil.gguf"}, 400, "invalid file name"),
        ({"url": "http://h/x.gguf", "sha256": "abc"}, 400, "64 hexadecimal"),
        ({"filename": "x.gguf"}, 400, "'url' is required"),
    ],
)
def test_bad_download_requests(dl_server, body, status, words):
    srv, models_dir = dl_server
    got, answer = call(srv.url + "/api/downloads", body)
    assert got == status and words in answer["error"]["message"], answer
    assert list(models_dir.iterdir()) == []


def test_download_errors(dl_server, files):
    (srv, models_dir), (base, _, data) = dl_server, files
    d = call(srv.url + "/api/downloads", {"url": base + "/missing.gguf"})[1]
    failed = _state(srv, d["id"], "failed")
    assert "404" in failed["error"]
    (models_dir / "there.gguf").write_bytes(data)
    status, body = call(srv.url + "/api/downloads", {"url": base + "/there.gguf"})
    assert status == 409 and "already in the models directory" in body["error"]["message"]
    status, body = call(srv.url + "/api/downloads/cancel", {"id": "999"})
    assert status == 404
    status, body = call(srv.url + "/api/downloads/pause", {"id": d["id"]})
    assert status == 409


def test_downloads_need_a_models_dir(model_sources):
    argv = ["--backend", "numpy", "-m", str(model_sources["alpha.gguf"])]
    with live_server([*argv, "-m", str(model_sources["gamma.gguf"])]) as srv:
        status, body = call(srv.url + "/api/downloads", {"url": "http://h/x.gguf"})
    assert status == 400 and "--models-dir" in body["error"]["message"]
