"""The ``pairwise`` communicator: a small point-to-point TCP protocol for exactly two ranks.

The fallback when not every rank has a collective library (see
``docs/plugins/comm-pairwise.md`` for the wire format). Rank 0 listens, rank 1 connects;
every collective is one full-duplex exchange of one frame each way, so an all-reduce
costs one payload transfer of latency, and both ranks compute ``own + peer`` — the same
bits on both sides, because floating-point addition is commutative.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

import numpy as np

from tessera.contract.comm import (
    Communicator,
    CommunicatorError,
    CommunicatorInfo,
    CommunicatorProbe,
    GroupSpec,
    nbytes,
)
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

MAGIC = b"TPW1"
#: magic, op, dtype code, flags, sequence number, payload length (little-endian, 24 bytes).
HEADER = struct.Struct("<4sBBHQQ")
OP_HELLO, OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER, OP_BYE = range(1, 7)
OP_NAMES = {1: "hello", 2: "all_reduce", 3: "all_gather", 4: "broadcast", 5: "barrier", 6: "bye"}
DTYPE_CODES = {
    "float32": 1,
    "float16": 2,
    "bfloat16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "float64": 7,
}


def _dtype_name(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _to_bytes(x: Any) -> tuple[memoryview, int]:
    """The array's bytes (C order) and its dtype code."""
    name = _dtype_name(x)
    if name not in DTYPE_CODES:
        raise CommunicatorError(f"the pairwise communicator cannot send {name} arrays")
    if isinstance(x, np.ndarray):
        return memoryview(np.ascontiguousarray(x).view(np.uint8).reshape(-1)), DTYPE_CODES[name]
    import torch

    raw = x.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy()
    return memoryview(raw), DTYPE_CODES[name]


def _from_bytes(buf: bytearray, like: Any) -> Any:
    """``buf`` as an array of ``like``'s kind, dtype, shape and device."""
    if isinstance(like, np.ndarray):
        return np.frombuffer(buf, dtype=like.dtype).reshape(like.shape)
    import torch

    if not buf:  # torch.frombuffer refuses empty buffers; zero-row ubatches send none
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    return torch.frombuffer(buf, dtype=like.dtype).reshape(like.shape).to(like.device)


class PairwiseCommunicator(Communicator):
    name = "pairwise"

    def __init__(self, spec: GroupSpec, sock: socket.socket) -> None:
        super().__init__(spec.rank, spec.world_size)
        self.sock = sock
        self.timeout_s = spec.timeout_s
        self.seq = 0
        self.peer = 1 - spec.rank
        self.path = "tcp (point-to-point, two ranks)"
        sock.setblocking(False)

    def _fail(self, what: str) -> CommunicatorError:
        return CommunicatorError(
            f"rank {self.rank}: {what}; the tensor-parallel group is broken, restart every rank"
        )

    def _exchange(self, op: int, x: Any) -> tuple[int, bytearray]:
        """Send one frame and receive the peer's, at the same time; return its dtype and bytes."""
        payload, code = _to_bytes(x) if x is not None else (memoryview(b""), 0)
        self.seq += 1
        out = [memoryview(HEADER.pack(MAGIC, op, code, 0, self.seq, len(payload))), payload]
        head, body = bytearray(HEADER.size), None
        got, want = 0, HEADER.size
        deadline = time.monotonic() + self.timeout_s
        while out or body is None or got < want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(
                    f"rank {self.peer} did not take part in {OP_NAMES[op]} within "
                    f"{self.timeout_s:g} s (it hangs or is too slow; raise --tp-timeout)"
                )
            readable, writable, _ = select.select([self.sock], [self.sock] if out else [], [], left)
            try:
                if writable:
                    sent = self.sock.send(out[0])
                    out[0] = out[0][sent:]
                    while out and not len(out[0]):
                        out.pop(0)
                if readable:
                    target = head if body is None else body
                    n = self.sock.recv_into(memoryview(target)[got:], want - got)
                    if n == 0:
                        raise self._fail(f"rank {self.peer} closed the connection (it stopped)")
                    got += n
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                raise self._fail(f"the connection to rank {self.peer} failed ({exc})") from exc
            if body is None and got == want:
                magic, peer_op, peer_code, _, seq, length = HEADER.unpack(head)
                if magic != MAGIC:
                    raise self._fail(f"rank {self.peer} sent a frame that is not pairwise")
                if peer_op == OP_BYE:
                    raise self._fail(f"rank {self.peer} left the group (it stopped)")
                if peer_op != op or seq != self.seq:
                    raise self._fail(
                        f"rank {self.peer} called {OP_NAMES.get(peer_op, peer_op)} #{seq} "
                        f"where this rank called {OP_NAMES[op]} #{self.seq}"
                    )
                body, got, want = bytearray(length), 0, length
        return peer_code, body

    def _all_reduce(self, x: Any) -> Any:
        code, body = self._exchange(OP_ALL_REDUCE, x)
        if len(body) != nbytes(x):
            raise self._fail(f"rank {self.peer} sent an all_reduce of another size")
        return x + _from_bytes(body, x)

    def _all_gather(self, x: Any) -> Any:
        _, body = self._exchange(OP_ALL_GATHER, x)
        peer = _from_bytes(body, x)
        pair = (x, peer) if self.rank == 0 else (peer, x)
        if isinstance(x, np.ndarray):
            return np.stack(pair)
        import torch

        return torch.stack(pair)

    def _broadcast(self, x: Any, root: int) -> Any:
        _, body = self._exchange(OP_BROADCAST, x if self.rank == root else None)
        return x if self.rank == root else _from_bytes(body, x)

    def _barrier(self) -> None:
        self._exchange(OP_BARRIER, None)

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(1.0)
            self.sock.sendall(HEADER.pack(MAGIC, OP_BYE, 0, 0, self.seq + 1, 0))
        except OSError:
            pass
        self.sock.close()


def _connect(spec: GroupSpec) -> socket.socket:
    deadline = time.monotonic() + spec.timeout_s
    if spec.rank == 0:
        try:
            server = socket.create_server((spec.host, spec.port))
        except OSError as exc:
            raise CommunicatorError(
                f"pairwise: rank 0 cannot listen on {spec.host}:{spec.port} ({exc})"
            ) from exc
        with server:
            server.settimeout(spec.timeout_s)
            try:
                sock, _ = server.accept()
            except TimeoutError as exc:
                raise CommunicatorError(
                    f"pairwise: rank 1 did not connect to {spec.host}:{spec.port} within "
                    f"{spec.timeout_s:g} s"
                ) from exc
    else:
        while True:
            try:
                sock = socket.create_connection((spec.host, spec.port), timeout=5.0)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise CommunicatorError(
                        f"pairwise: cannot reach rank 0 at {spec.host}:{spec.port} ({exc})"
                    ) from exc
                time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def create(spec: GroupSpec) -> PairwiseCommunicator:
    if spec.world_size != 2:
        raise CommunicatorError(
            f"the pairwise communicator connects exactly two ranks, not {spec.world_size}"
        )
    comm = PairwiseCommunicator(spec, _connect(spec))
    comm._exchange(OP_HELLO, None)  # both ends speak TPW1 before the first collective
    return comm


def probe(device: str) -> CommunicatorProbe:
    # Plain sockets work everywhere; tensors on a GPU travel through host memory.
    return CommunicatorProbe(True, ("tcp",))


@hookimpl
def tessera_register_communicators(register):
    register(
        CommunicatorInfo(
            "pairwise",
            create,
            probe,
            "point-to-point TCP between exactly two ranks (the fallback)",
            collective=False,
            max_ranks=2,
        )
    )
