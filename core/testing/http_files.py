"""A loopback HTTP file server with ``Range`` support that can break a transfer midway,
for tests of resumable downloads."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attrs


@attrs.define
class FileServerControl:
    """What the server serves and how it misbehaves; tests change it between requests."""

    files: dict[str, bytes]
    #: file name -> byte offset where the *next* transfer of that file is cut (once).
    cut_at: dict[str, int] = attrs.field(factory=dict)
    #: Seconds to sleep after each 16 KiB (a slow server, for pausing mid-transfer).
    delay_s: float = 0.0
    #: Answer 200 with the whole file even to a Range request.
    ignore_range: bool = False
    #: (path, Range header or None) of every request, in order.
    requests: list[tuple[str, str | None]] = attrs.field(factory=list)


def _handler(control: FileServerControl) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            range_header = self.headers.get("Range")
            control.requests.append((self.path, range_header))
            data = control.files.get(name)
            if data is None:
                self.send_error(404)
                return
            etag = f'"{len(data)}-{hash(data) & 0xFFFFFFFF:x}"'
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", range_header or "")
            if_range = self.headers.get("If-Range")
            if m and not control.ignore_range and (if_range is None or if_range == etag):
                start = int(m.group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            cut = control.cut_at.pop(name, None)
            pos = start
            while pos < len(data):
                end = min(pos + (1 << 14), len(data))
                if cut is not None and end > cut:
                    self.wfile.write(data[pos:cut])
                    self.wfile.flush()
                    # a broken connection, as when a network drops: no more bytes, no close
                    # handshake the client could mistake for the end of the file
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(data[pos:end])
                pos = end
                if control.delay_s:
                    time.sleep(control.delay_s)

    return Handler


@contextlib.contextmanager
def file_server(files: Mapping[str, bytes]) -> Iterator[tuple[str, FileServerControl]]:
    """Serve ``files`` at ``http://127.0.0.1:PORT/NAME``; yield (base URL, control)."""
    control = FileServerControl(dict(files))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(control))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", control
    finally:
        httpd.shutdown()
        httpd.server_close()
