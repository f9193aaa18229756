"""Make vLLM's engine core exit when the process that started it (the front end) is gone.

vllm 0.32.0's engine core does not watch its front end: when a trainer is killed with SIGKILL (a
preemption, an OOM kill, our own demo), the ``VLLM::EngineCore`` child is re-parented and keeps
polling, holding its memory and a core's worth of CPU, forever. A trainer restarted after such a
kill then competes with its own ghost.

The guard needs no process id, which would be wrong outside the simplest layout: under vLLM's Ray
executor a worker's parent is the raylet, and the front end's pid means nothing on another node or
in another PID namespace (killing "the parent" there kills the raylet). Instead the front end holds
a *lifeline*: a listening TCP socket served by a daemon thread, one per process
(:func:`lifeline`). Each vLLM worker connects to it when the engine starts (:func:`start`, called
from the worker's probe RPC), checks that the server greets it with the front end's token (so a
port reused by some other process is never taken for the front end), and then blocks reading the
connection. Nothing is ever sent on it after the greeting; the kernel closes the front end's end
when that process dies, however it dies, so the worker reads end-of-file and ends its own process.

A worker ends only itself. vLLM takes it from there: with one device the worker *is* the engine
core; the multiprocess and Ray executors watch their workers and shut the engine core down when one
dies, and an engine core's own workers end with it. Where the lifeline cannot be reached, the
worker warns and runs unguarded rather than guess.
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
"""How long a worker tries to reach the lifeline (and read its greeting) at engine start."""

KEEPALIVE_S = 10
"""TCP keep-alive idle time and probe interval: a front end whose whole node vanished (no FIN ever
arrives) is declared gone after about ``KEEPALIVE_S * (1 + KEEPALIVE_PROBES)`` seconds."""

KEEPALIVE_PROBES = 3


@dataclass(frozen=True, kw_only=True)
class Lifeline:
    """Where a worker reaches its front end's lifeline; plain data, so it crosses vLLM's RPC."""

    hosts: tuple[str, ...]
    """Addresses to try in order: this node's address (for workers on other nodes), then loopback."""
    port: int
    """The listening port."""
    token: str
    """Hex token the server greets every connection with; identifies this front-end process."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types, as vLLM's RPC encoding carries them."""
        return {"hosts": list(self.hosts), "port": self.port, "token": self.token}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lifeline:
        return cls(hosts=tuple(str(h) for h in data["hosts"]), port=int(data["port"]), token=str(data["token"]))


class _Server:
    """The front end's side: accept every connection, greet it, and hold it until the peer closes."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.listener = socket.create_server(("", 0), backlog=64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        threading.Thread(target=self._serve, name="partial-rollout-lifeline", daemon=True).start()

    def _serve(self) -> None:
        greeting = self.token.encode("ascii")
        while True:
            for key, _ in self.selector.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    try:  # out of descriptors, say: the next worker finds no lifeline and warns
                        conn, _ = sock.accept()
                    except OSError:
                        time.sleep(0.1)  # the listener stays readable: do not spin
                        continue
                    try:
                        conn.sendall(greeting)
                    except OSError:
                        conn.close()
                        continue
                    conn.setblocking(False)
                    self.selector.register(conn, selectors.EVENT_READ)
                    continue
                try:  # a worker never sends; readable means it closed (its engine ended)
                    data = sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    sock.close()

    def close_inherited(self) -> None:
        """In a forked child: drop the copies of the lifeline's sockets, or the child would keep the
        front end's end open after the front end died, and its workers would never be told."""
        for key in list(self.selector.get_map().values()):
            fileobj = key.fileobj
            if isinstance(fileobj, socket.socket):
                fileobj.close()
        self.selector.close()


_server: _Server | None = None
_server_lock = threading.Lock()
_guarded = False


def _forget_server_in_child() -> None:
    global _server
    if _server is not None:
        _server.close_inherited()
        _server = None


os.register_at_fork(after_in_child=_forget_server_in_child)


def _node_address() -> str | None:
    """This node's address as vLLM advertises it to other nodes (``VLLM_HOST_IP`` or the default route)."""
    try:
        from vllm.utils.network_utils import get_ip
    except ImportError:
        return None
    try:
        return str(get_ip())
    except Exception:
        return None


def lifeline() -> Lifeline:
    """This process's lifeline, started on first use; pass it to :func:`start` in every worker."""
    global _server
    with _server_lock:
        if _server is None:
            _server = _Server()
        server = _server
    hosts = tuple(dict.fromkeys(h for h in (_node_address(), "127.0.0.1") if h))
    return Lifeline(hosts=hosts, port=int(server.listener.getsockname()[1]), token=server.token)


def _connect(line: Lifeline) -> socket.socket | None:
    """A connection to the front end that greeted with its token, or ``None`` (with the reasons logged)."""
    errors = []
    for host in line.hosts:
        try:
            conn = socket.create_connection((host, line.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            errors.append(f"{host}:{line.port}: {exc}")
            continue
        try:
            greeting = b""
            while len(greeting) < len(line.token):
                chunk = conn.recv(len(line.token) - len(greeting))
                if not chunk:
                    break
                greeting += chunk
        except OSError as exc:
            greeting = b""
            errors.append(f"{host}:{line.port}: {exc}")
        if greeting == line.token.encode("ascii"):
            conn.settimeout(None)
            return conn
        conn.close()
        errors.append(f"{host}:{line.port}: not this engine's front end")
    logger.warning("partial-rollout orphan guard not started, front end unreachable (%s)", "; ".join(errors))
    return None


def _keepalive(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            conn.setsockopt(socket.IPPROTO_TCP, option, value)


def _watch(conn: socket.socket) -> None:
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    print(
        f"partial-rollout: the engine's front end is gone; ending this vLLM process (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def start(line: Lifeline) -> bool:
    """In a vLLM worker: end this process once the front end behind ``line`` is gone.

    Returns whether a guard was started: ``False`` when this process already has one, when it is the
    front end itself, or when the lifeline cannot be reached (a warning says why).
    """
    global _guarded
    if _guarded or (_server is not None and _server.token == line.token):
        return False
    conn = _connect(line)
    if conn is None:
        return False
    _keepalive(conn)
    _guarded = True
    threading.Thread(target=_watch, args=(conn,), name="partial-rollout-orphan-guard", daemon=True).start()
    return True
