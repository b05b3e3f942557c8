"""Several hosts (FastDeploy's ``--ips``): which ranks each host runs, and how they meet.

FastDeploy's rule: the same command runs on every host; the hosts are listed in
``--ips`` in order, the first is the master (it runs the engine and the API
server, and only it takes requests), and the ``--tensor-parallel-size`` ranks
split evenly over the hosts: host ``k`` of ``n`` runs ranks
``[k * N/n, (k + 1) * N/n)``. A host finds its position by the first address in
the list it can bind (``FD_NODE_RANK`` sets it, e.g. when every entry is
127.0.0.1 in a test).

The ranks meet at the master: the rendezvous store on ``ips[0]:FD_MASTER_PORT``
(``process_group``), and the step listener on the next port, which a rank on
another host connects to (``connect_to_master``): it sends its rank, receives its
``WorkerSpec`` (the master's model path, flags and runner), then each step's
message on that socket (``channel``). Another host runs ``run_node``: it starts
its ranks as ``python -m fd_core.parallel.worker --connect ...``, waits, and stops
them all when one fails or it is stopped. ``fd-serve --ips ...`` on a host that is
not the master runs ``run_node`` instead of a server. Called by
``fd_core.parallel.driver`` (the master's side) and ``fd_core.entrypoints.serve``.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from fd_core import envs

__all__ = ["NodeLayout", "StepListener", "connect_to_master", "node_layout", "run_node"]

logger = logging.getLogger(__name__)

_LEN = struct.Struct("<Q")


@dataclass(frozen=True)
class NodeLayout:
    """The hosts of one engine and this host's part."""

    ips: tuple[str, ...]
    node_rank: int
    world: int
    master_port: int

    @property
    def per_node(self) -> int:
        return self.world // len(self.ips)

    @property
    def master_addr(self) -> str:
        return self.ips[0]

    @property
    def step_port(self) -> int:
        return self.master_port + 1

    @property
    def local_ranks(self) -> range:
        return range(self.node_rank * self.per_node, (self.node_rank + 1) * self.per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.per_node


def _bindable(addr: str) -> bool:
    """Whether ``addr`` is one of this host's addresses (a socket binds to it)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def node_layout(ips: list[str] | tuple[str, ...] | str, world: int) -> NodeLayout:
    """Check ``--ips`` against ``--tensor-parallel-size world`` and find this host in it;
    ValueError naming the bad value otherwise."""
    hosts = tuple(p.strip() for p in ips.split(",") if p.strip()) if isinstance(ips, str) else tuple(ips)
    listed = ",".join(hosts)
    if not hosts:
        raise ValueError("--ips is empty; list the hosts, the first one the master, e.g. 10.0.0.1,10.0.0.2")
    for h in hosts:
        try:
            socket.inet_aton(h)
        except OSError:
            raise ValueError(f"--ips {listed}: {h!r} is not an IPv4 address") from None
    if world % len(hosts):
        raise ValueError(f"--ips lists {len(hosts)} hosts, but --tensor-parallel-size {world} does not split evenly "
                         f"over them; use a size that is a multiple of {len(hosts)}")
    configured = envs.get("FD_NODE_RANK")
    if configured is not None:
        if configured >= len(hosts):
            raise ValueError(f"FD_NODE_RANK={configured}, but --ips {listed} lists {len(hosts)} hosts "
                             f"(0..{len(hosts) - 1})")
        node = int(configured)
    else:
        found = [i for i, h in enumerate(hosts) if _bindable(h)]
        if not found:
            raise ValueError(f"--ips {listed}: this host ({socket.gethostname()}) has none of these addresses; "
                             "list its address, or set FD_NODE_RANK to its position")
        node = found[0]
    if node == 0 and not _bindable(hosts[0]):
        raise ValueError(f"--ips {listed}: this host is the master (position 0), but {hosts[0]} is not one of "
                         "its addresses")
    return NodeLayout(hosts, node, world, int(envs.get("FD_MASTER_PORT")))


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv(sock: socket.socket, timeout_s: float | None) -> bytes:
    sock.settimeout(timeout_s)
    try:
        head = _recv_exact(sock, _LEN.size)
        return _recv_exact(sock, _LEN.unpack(head)[0])
    finally:
        sock.settimeout(None)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 22))
        if not chunk:
            raise ConnectionError("the connection closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class StepListener:
    """The master's listener for ranks on other hosts (``layout.step_port``)."""

    def __init__(self, layout: NodeLayout) -> None:
        self.layout = layout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((layout.master_addr, layout.step_port))
        except OSError as exc:
            self.sock.close()
            raise ValueError(f"--ips: cannot listen on {layout.master_addr}:{layout.step_port} for the other "
                             f"hosts' ranks ({exc}); set FD_MASTER_PORT to a free port") from None
        self.sock.listen(layout.world)

    def accept(self, spec_for: Any, timeout_s: float) -> dict[int, socket.socket]:
        """Every remote rank's socket, each sent ``spec_for(rank)``; TimeoutError names the missing ones."""
        lay = self.layout
        remote = [r for r in range(lay.world) if lay.node_of(r) != 0]
        got: dict[int, socket.socket] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(got) < len(remote):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in remote if r not in got]
                    hosts = sorted({lay.ips[lay.node_of(r)] for r in missing})
                    raise TimeoutError(
                        f"tensor-parallel rank(s) {', '.join(map(str, missing))} (on {', '.join(hosts)}) did not "
                        f"connect to {lay.master_addr}:{lay.step_port} within {timeout_s:.0f} s; start the same "
                        "command on every host of --ips (FD_TP_RENDEZVOUS_TIMEOUT sets the limit)")
                self.sock.settimeout(min(left, 0.5))
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                try:
                    rank = int(_recv(conn, 10).decode())
                except (OSError, ValueError):
                    conn.close()
                    continue
                if rank not in remote or rank in got:
                    _send(conn, pickle.dumps(ValueError(f"rank {rank} is not expected from another host")))
                    conn.close()
                    continue
                _send(conn, pickle.dumps(spec_for(rank)))
                got[rank] = conn
        except BaseException:
            for conn in got.values():
                conn.close()
            raise
        return got

    def close(self) -> None:
        self.sock.close()


def connect_to_master(addr: str, port: int, rank: int, timeout_s: float) -> tuple[socket.socket, Any]:
    """A remote rank's socket to the master, and its ``WorkerSpec``; retried until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=min(5.0, max(0.1, deadline - time.monotonic())))
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"tensor-parallel rank {rank} could not reach the master {addr}:{port} "
                                      f"within {timeout_s:.0f} s ({exc}); is the first host of --ips up and "
                                      "running the same command?") from None
            time.sleep(0.5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    _send(sock, str(rank).encode())
    spec = pickle.loads(_recv(sock, timeout_s))
    if isinstance(spec, Exception):
        raise spec
    return sock, spec


def run_node(layout: NodeLayout, visible_devices_env: str | None, threads: int | None) -> int:
    """Run this (non-master) host's ranks until they end; the exit code (the first failure's)."""
    from fd_core.parallel.config import rank_device_id

    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for local, rank in enumerate(layout.local_ranks):
            env = dict(os.environ)
            if threads is not None:
                env["FD_CPU_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
            device = rank_device_id(visible_devices_env, os.environ, local, layout.per_node)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fd_core.parallel.worker", "--connect",
                 f"{layout.master_addr}:{layout.step_port}", "--rank", str(rank), "--device-id", str(device)],
                env=env))
        logger.info("node %d of --ips %s: ranks %s (pids %s)", layout.node_rank, ",".join(layout.ips),
                    list(layout.local_ranks), ", ".join(str(p.pid) for p in procs))
        while not stopping:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in zip(layout.local_ranks, codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                logger.error("tensor-parallel rank %d exited with code %d; stopping this node's ranks", rank, code)
                return 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)


def node_main(ips: str | list[str], world: int, backend_name: str) -> int | None:
    """``fd-serve --ips ...`` on a host that is not the master: run its ranks (``run_node``)
    and return the exit code; None on the master (which serves)."""
    layout = node_layout(ips, world)
    if layout.node_rank == 0:
        return None
    from fd_core.backends import get_backend

    env_name = get_backend(backend_name).info.visible_devices_env
    threads = None
    if env_name is None:  # a host backend: this host's ranks split its cores
        configured = envs.get("FD_CPU_NUM_THREADS")
        threads = int(configured) if configured is not None else max(1, len(os.sched_getaffinity(0)) // layout.per_node)
    return run_node(layout, env_name, threads)
