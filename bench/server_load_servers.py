"""The two servers of bench/server_load.py, started the same way: ``tessera serve`` and
llama.cpp's ``llama-server``, each a subprocess on a free loopback port with its log in a
file, ready once ``/health`` answers 200.

Both get the same GGUF, slots (``-np``), threads, batch sizes, attention and cache types.
Their contexts differ in shape: tessera's ``-c`` is one KV pool shared by every slot (a
slot may fill all of it), while llama-server with ``-np`` splits ``-c`` evenly across its
slots unless ``-kvu`` is given. :func:`start_llama_server` sizes llama-server so that one
slot holds as many tokens as in tessera, and :func:`per_slot_ctx` reads both back.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class ServerFlags:
    """What both servers are started with."""

    model: Path
    n_slots: int
    n_ctx: int  #: tessera's -c: the shared pool, and so one slot's most tokens
    threads: int
    batch_size: int
    ubatch_size: int
    flash_attn: str
    cache_type_k: str | None = None
    cache_type_v: str | None = None

    def common(self) -> list[str]:
        """The flags both servers spell alike (llama.cpp's names)."""
        out = ["-m", str(self.model), "-np", str(self.n_slots), "-t", str(self.threads)]
        out += ["-b", str(self.batch_size), "-ub", str(self.ubatch_size), "-fa", self.flash_attn]
        if self.cache_type_k:
            out += ["-ctk", self.cache_type_k]
        if self.cache_type_v:
            out += ["-ctv", self.cache_type_v]
        return out


@attrs.define
class Server:
    """A started server: its process, base URL and log file."""

    name: str
    proc: subprocess.Popen
    url: str
    log: Path
    ctx_flags: str  #: how its context was asked for, for the report

    def stop(self) -> None:
        """Terminate and wait (kill after 60 s)."""
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu_seconds(self) -> float:
        """User plus system CPU time the process has used so far (``/proc/PID/stat``)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def get(self, path: str) -> Any:
        """The JSON body of ``GET path``."""
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.load(resp)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(name: str, cmd: list[str], ctx_flags: str, timeout_s: float = 600) -> Server:
    log = Path(tempfile.mkstemp(prefix=f"server-load-{name}-", suffix=".log")[1])
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(name, proc, f"http://127.0.0.1:{port}", log, ctx_flags)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5):
                return server
        except OSError:  # refused while starting, 503 while llama-server loads the model
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                tail = "".join(log.read_text(errors="replace").splitlines(True)[-20:])
                why = f"{name} did not start ({' '.join(cmd)}); its log:\n{tail}"
                raise SystemExit(why) from None
            time.sleep(0.2)


def start_tessera(flags: ServerFlags, extra: list[str]) -> Server:
    """``tessera serve`` with ``flags`` and ``-c n_ctx`` (one pool for all slots)."""
    cmd = [sys.executable, "-m", "tessera", "serve", *flags.common(), "-c", str(flags.n_ctx)]
    return _start("tessera", cmd + extra, f"-c {flags.n_ctx} (one KV pool shared by the slots)")


def start_llama_server(binary: Path, flags: ServerFlags, unified: bool, extra: list[str]) -> Server:
    """llama-server with ``flags``, its web UI off; ``unified``: ``-kvu -c n_ctx`` (tessera's
    layout), else ``-no-kvu -c n_slots*n_ctx`` (its default with ``-np``: one part a slot)."""
    if unified:
        ctx, how = ["-kvu", "-c", str(flags.n_ctx)], f"-kvu -c {flags.n_ctx} (one KV pool)"
    else:
        total = flags.n_slots * flags.n_ctx
        ctx, how = ["-no-kvu", "-c", str(total)], f"-no-kvu -c {total} (split across the slots)"
    cmd = [str(binary), *flags.common(), *ctx, "--no-webui", *extra]
    return _start("llama-server", cmd, how)


def per_slot_ctx(server: Server) -> int:
    """The most tokens one slot can hold: tessera's ``n_ctx`` from ``/props`` (its pool is
    shared), llama-server's ``n_ctx`` of slot 0 from ``/slots``."""
    if server.name == "tessera":
        return int(server.get("/props")["n_ctx"])
    return int(server.get("/slots")[0]["n_ctx"])


def n_ctx_train(server: Server) -> int:
    """The model's training context as llama-server reports it (``/v1/models`` meta)."""
    return int(server.get("/v1/models")["data"][0]["meta"]["n_ctx_train"])


def slot_ctx_note(tessera: int, llama: int, train: int, need: int) -> str:
    """How the per-slot contexts compare, in a sentence for the report; SystemExit where
    they differ for another reason than llama-server's cap at the training context, or
    where a slot cannot hold a request (``need`` tokens)."""
    if min(tessera, llama) < need:
        raise SystemExit(
            f"a slot holds {min(tessera, llama)} tokens, fewer than the {need} a request may "
            "need; raise -c or lower --max-tokens / --prompt-words"
        )
    if tessera == llama:
        return f"one slot holds {tessera} tokens on both"
    if llama == train < tessera:
        return (
            f"one slot holds {tessera} tokens on tessera, {llama} on llama-server (it caps a "
            f"slot at the model's training context, {train}); both hold a request's {need}"
        )
    raise SystemExit(
        f"the servers' per-slot contexts differ (tessera {tessera}, llama-server {llama}); "
        "llama.cpp pads a slot's context to a multiple of 256, so give -c as one"
    )


def llama_server_version(binary: Path) -> str:
    """The ``version:`` line of ``llama-server --version`` (e.g. ``0.5.0-dev (build 1, ...)``)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("version:"):
            return line.removeprefix("version:").strip()
    raise SystemExit(f"{binary} --version printed no 'version:' line; is it llama-server?")


def tessera_version() -> str:
    """The installed tessera version and the checkout's commit (``+dirty`` with changes)."""
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except OSError:
        commit = ""
    return version("tessera") + (f" ({commit})" if commit else "")


def cpu_model() -> str:
    """lscpu's "Model name" (``/proc/cpuinfo``'s ``model name`` where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        key = "Model name:"
    except OSError:
        text, key = Path("/proc/cpuinfo").read_text(), "model name"
    for line in text.splitlines():
        if line.strip().startswith(key):
            return line.split(":", 1)[1].strip()
    return "unknown"
