"""Downloading model files into the models directory, resumable, one thread each.

The bytes go to ``.NAME.part`` (the registry ignores dot-files); a paused or broken
download keeps them and resumes with an HTTP ``Range`` request (``If-Range`` with the
first answer's ETag or Last-Modified, so a file changed on the server starts over). Once
every byte is there and the sha256 matches (when one was given), the part file is
renamed to ``NAME``: the model appears in the registry only complete.
"""

from __future__ import annotations

import hashlib
import http.client
import itertools
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tessera.contract.routes import ApiError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_CHUNK = 1 << 16
#: Seconds a silent connection may stall before the download counts as interrupted.
TIMEOUT_S = 30.0


@attrs.define(eq=False)
class Download:
    """One download and its progress (``state``: downloading, paused, interrupted,
    failed, done, cancelled)."""

    id: str
    url: str
    filename: str
    sha256: str | None
    part: Path
    final: Path
    state: str = "downloading"
    done_bytes: int = 0
    total_bytes: int | None = None
    error: str | None = None
    bytes_per_s: float = 0.0
    validator: str | None = None
    #: The current attempt got an answer from the server (a failure before that means it
    #: never connected: nothing was interrupted).
    answered: bool = False
    stop: threading.Event = attrs.field(factory=threading.Event)
    thread: threading.Thread | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "filename": self.filename,
            "sha256": self.sha256,
            "state": self.state,
            "done_bytes": self.done_bytes,
            "total_bytes": self.total_bytes,
            "bytes_per_s": round(self.bytes_per_s),
            "error": self.error,
        }


def download_filename(url: str, filename: str | None) -> str:
    """The file name to save ``url`` as: ``filename`` or the URL's last path part; a name
    with a path in it, or not a ``.gguf`` file, is refused (400)."""
    name = filename or urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not _NAME.fullmatch(name) or ".." in name or not name.endswith(".gguf"):
        raise ApiError(
            400,
            f"invalid file name {name!r}: give a 'filename' of letters, digits, '.', '_' or '-' "
            "ending in .gguf, with no path separators or '..'",
            "filename",
        )
    return name


class Downloads:
    """The downloads into ``models_dir``; ``on_done(path)`` is called for each finished one."""

    def __init__(self, models_dir: Path, on_done: Callable[[Path], None]) -> None:
        self.models_dir = models_dir
        self.on_done = on_done
        self._items: dict[str, Download] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def list(self) -> list[Download]:
        return list(self._items.values())

    def get(self, download_id: str) -> Download:
        try:
            return self._items[str(download_id)]
        except KeyError:
            raise ApiError(
                404, f"no download with id {download_id!r}; see /api/downloads"
            ) from None

    def start(self, url: str, filename: str | None = None, sha256: str | None = None) -> Download:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ApiError(400, f"'url' must be an http:// or https:// URL, got {url!r}", "url")
        if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise ApiError(400, "'sha256' must be 64 hexadecimal digits", "sha256")
        name = download_filename(url, filename)
        final = self.models_dir / name
        with self._lock:
            if final.exists():
                raise ApiError(409, f"'{name}' is already in the models directory; delete it first")
            for d in self._items.values():
                if d.filename == name and d.state in ("downloading", "paused", "interrupted"):
                    raise ApiError(
                        409,
                        f"'{name}' is already being downloaded (id {d.id}); resume or cancel it",
                    )
            d = Download(
                str(next(self._ids)),
                url,
                name,
                sha256.lower() if sha256 else None,
                self.models_dir / f".{name}.part",
                final,
            )
            d.part.unlink(missing_ok=True)  # a stale part of an earlier server run
            self._items[d.id] = d
        self._spawn(d)
        return d

    def _spawn(self, d: Download) -> None:
        d.stop = threading.Event()
        d.state, d.error = "downloading", None
        d.thread = threading.Thread(target=self._run, args=(d,), name="tessera-download")
        d.thread.daemon = True
        d.thread.start()

    def resume(self, download_id: str) -> Download:
        d = self.get(download_id)
        if d.state not in ("paused", "interrupted"):
            raise ApiError(
                409, f"download {d.id} is {d.state}; only a paused or broken one resumes"
            )
        self._join(d)
        self._spawn(d)
        return d

    def pause(self, download_id: str) -> Download:
        d = self.get(download_id)
        if d.state != "downloading":
            raise ApiError(409, f"download {d.id} is {d.state}; only a running one pauses")
        d.state = "paused"
        d.stop.set()
        return d

    def cancel(self, download_id: str) -> Download:
        """Stop a download and delete its partial file (a finished one stays)."""
        d = self.get(download_id)
        if d.state == "done":
            raise ApiError(409, f"download {d.id} is done; delete the model instead")
        d.state = "cancelled"
        d.stop.set()
        self._join(d)
        d.part.unlink(missing_ok=True)
        return d

    def close(self) -> None:
        for d in self._items.values():
            d.stop.set()
        for d in self._items.values():
            self._join(d)

    @staticmethod
    def _join(d: Download) -> None:
        if d.thread is not None and d.thread is not threading.current_thread():
            d.thread.join(TIMEOUT_S)

    # -- the download thread ----------------------------------------------------------

    def _run(self, d: Download) -> None:
        try:
            if self._fetch(d):
                self._finish(d)
        except urllib.error.HTTPError as exc:
            d.state, d.error = "failed", f"the server answered {exc.code} {exc.reason} for {d.url}"
            d.part.unlink(missing_ok=True)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if d.state != "downloading":
                return
            if d.answered:
                d.state = "interrupted"
                d.error = f"the transfer broke ({exc}); resume it to continue where it stopped"
                return
            host = urllib.parse.urlsplit(d.url).netloc
            reason = getattr(exc, "reason", exc)
            if d.part.exists() and d.part.stat().st_size:
                d.state = "interrupted"
                d.error = f"could not reconnect to {host} ({reason}); resume it to try again"
            else:
                d.state = "failed"
                d.error = (
                    f"could not connect to {host} ({reason}); check the URL and that the "
                    "server is reachable, then start the download again"
                )
                d.part.unlink(missing_ok=True)

    def _fetch(self, d: Download) -> bool:
        """Transfer the missing bytes into the part file; False when stopped."""
        offset = d.part.stat().st_size if d.part.exists() else 0
        headers = {"User-Agent": "tessera"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if d.validator:
                headers["If-Range"] = d.validator
        request = urllib.request.Request(d.url, headers=headers)
        d.answered = False
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as r:
            d.answered = True
            if offset and r.status == 206:
                start, total = _content_range(r.headers.get("Content-Range", ""))
                if start != offset:
                    raise ValueError(f"asked for bytes from {offset}, got them from {start}")
            else:  # no range support, or the file changed: start over
                offset = 0
                length = r.headers.get("Content-Length")
                total = int(length) if length is not None else None
            d.validator = r.headers.get("ETag") or r.headers.get("Last-Modified")
            d.total_bytes, d.done_bytes = total, offset
            t0, got = time.monotonic(), 0
            with open(d.part, "ab" if offset else "wb") as f:
                while chunk := r.read(_CHUNK):
                    if d.stop.is_set():
                        return False
                    f.write(chunk)
                    got += len(chunk)
                    d.done_bytes = offset + got
                    d.bytes_per_s = got / max(time.monotonic() - t0, 1e-6)
        if d.stop.is_set():
            return False
        if total is not None and d.done_bytes != total:
            raise OSError(f"connection closed after {d.done_bytes} of {total} bytes")
        return True

    def _finish(self, d: Download) -> None:
        if d.sha256 is not None:
            h = hashlib.sha256()
            with open(d.part, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            if h.hexdigest() != d.sha256:
                d.part.unlink(missing_ok=True)
                d.state = "failed"
                d.error = (
                    f"checksum mismatch: expected sha256 {d.sha256}, got {h.hexdigest()}; "
                    "the file was removed"
                )
                return
        if d.final.exists():
            d.state, d.error = "failed", f"'{d.filename}' appeared meanwhile; not overwritten"
            return
        os.replace(d.part, d.final)
        d.state = "done"
        self.on_done(d.final)


def _content_range(value: str) -> tuple[int, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None when ``*``)."""
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", value.strip())
    if m is None:
        raise ValueError(f"bad Content-Range {value!r}")
    return int(m.group(1)), None if m.group(3) == "*" else int(m.group(3))
