"""``--splitwise-role`` and FastDeploy's disaggregation flags, checked once.

FastDeploy's single-machine lines: the prefill instance is started with
``--splitwise-role prefill --engine-worker-queue-port P``; the decode
instance with ``--splitwise-role decode --innode-prefill-ports P[,P2...]``
and clients talk to the decode instance. Here the prefill instance listens
for KV-transfer tasks on ``127.0.0.1:<engine-worker-queue-port>`` and, with
``--pd-comm-port``, on every interface at that port (another host's decode
instance names it ``host:port``). ``--cache-transfer-protocol``: ``tcp``
(built in, ZeroMQ) or a name a backend's ``fd_kv_transport`` hook answers
(FastDeploy's ``ipc`` / ``rdma``); the default is ``tcp``.

Called by ``fd_core.disagg.engine.disaggregate`` with the engine's EngineArgs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fd_core.errors import UnsupportedFeatureError

__all__ = ["BUILTIN_PROTOCOL", "ROLES", "DisaggConfig", "advertised_address", "disagg_config_from",
           "parse_addresses"]

ROLES = ("mixed", "prefill", "decode")
BUILTIN_PROTOCOL = "tcp"


@dataclass(frozen=True)
class DisaggConfig:
    """One instance's part in prefill/decode disaggregation."""

    role: str  # "prefill" or "decode" ("mixed" builds no DisaggConfig)
    listen: tuple[str, ...] = ()  # prefill: "host:port" addresses it serves tasks on
    prefill_addrs: tuple[str, ...] = ()  # decode: "host:port" of the prefill instances it may use
    protocols: tuple[str, ...] = (BUILTIN_PROTOCOL,)  # in order of preference
    timeout_s: float = 60.0  # a transfer not answered by then fails its request (FD_PD_TRANSFER_TIMEOUT)
    # decode: addresses x-fd-prefill-addr may name beyond prefill_addrs (FD_PD_ALLOWED_PREFILL_ADDRS;
    # "*" any): a prefill instance's KV lands in the prefix cache, so it must be one this instance trusts
    extra_allowed: tuple[str, ...] = ()

    def allows(self, addr: str) -> bool:
        """Whether a request may have ``addr`` prefill it (``x-fd-prefill-addr``)."""
        return addr in self.prefill_addrs or "*" in self.extra_allowed or addr in self.extra_allowed

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError(f"--splitwise-role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"the KV transfer timeout must be > 0 seconds, got {self.timeout_s}")
        if self.role == "prefill" and not self.listen:
            raise ValueError("--splitwise-role prefill needs --engine-worker-queue-port (or --pd-comm-port): "
                             "the port a decode instance's --innode-prefill-ports names")
        if self.role == "decode" and not self.prefill_addrs:
            raise ValueError("--splitwise-role decode needs --innode-prefill-ports: the "
                             "--engine-worker-queue-port of each prefill instance (host:port for another host)")


def _ports(value: Any, flag: str) -> list[str]:
    """A port list as FastDeploy gives it: "8182", "8182,8183", [8182] or 8182."""
    if value is None or value == "":
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = []
    for item in items:
        text = str(item).strip()
        if text:
            out.append(text)
    for text in out:
        port = text.rpartition(":")[2]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: {text!r} is not a port (1-65535) or host:port")
    return out


def _one_port(value: Any, flag: str) -> list[str]:
    """A port flag that takes one value here (FastDeploy lists one per data-parallel rank,
    which a prefill instance does not have): several are refused, naming them."""
    ports = _ports(value, flag)
    if len(ports) > 1:
        raise ValueError(f"{flag}: one port per prefill instance, got {', '.join(ports)} (a list is one port per "
                         "data-parallel rank in FastDeploy; --data-parallel-size is not used with --splitwise-role)")
    return ports


def parse_addresses(value: Any, flag: str = "--innode-prefill-ports") -> tuple[str, ...]:
    """"8182,otherhost:8182" -> ("127.0.0.1:8182", "otherhost:8182")."""
    return tuple(p if ":" in p else f"127.0.0.1:{p}" for p in _ports(value, flag))


def disagg_config_from(args: Any, timeout_s: float = 60.0, allowed: str | None = None) -> DisaggConfig | None:
    """The DisaggConfig of EngineArgs ``args``; None for ``--splitwise-role mixed``.
    Raises ValueError naming a bad flag value (UnsupportedFeatureError: with tensor parallelism)."""
    role = (getattr(args, "splitwise_role", None) or "mixed").strip().lower()
    if role not in ROLES:
        raise ValueError(f"--splitwise-role must be one of {', '.join(ROLES)}, got {role!r}")
    if role == "mixed":
        return None
    protocol = getattr(args, "cache_transfer_protocol", None) or BUILTIN_PROTOCOL
    protocols = tuple(p.strip().lower() for p in str(protocol).split(",") if p.strip())
    if not protocols:
        raise ValueError(f"--cache-transfer-protocol: no protocol named in {protocol!r}; use {BUILTIN_PROTOCOL}")
    if getattr(args, "tensor_parallel_size", 1) > 1:
        raise UnsupportedFeatureError(
            f"--splitwise-role {role} with --tensor-parallel-size {args.tensor_parallel_size} is not implemented "
            "yet (issue 18: the KV transfer moves one rank's pool); run each prefill and decode instance with "
            "--tensor-parallel-size 1")
    listen: tuple[str, ...] = ()
    prefill: tuple[str, ...] = ()
    if role == "prefill":
        local = [f"127.0.0.1:{p.rpartition(':')[2]}"
                 for p in _one_port(getattr(args, "engine_worker_queue_port", None), "--engine-worker-queue-port")]
        remote = [f"0.0.0.0:{p.rpartition(':')[2]}"
                  for p in _one_port(getattr(args, "pd_comm_port", None), "--pd-comm-port")]
        listen = tuple(local + remote)
    else:
        prefill = parse_addresses(getattr(args, "innode_prefill_ports", None))
    extra = ("*",) if (allowed or "").strip() == "*" else parse_addresses(allowed, "FD_PD_ALLOWED_PREFILL_ADDRS")
    return DisaggConfig(role, listen, prefill, protocols, timeout_s, extra)


def advertised_address(args: Any, host: str | None) -> str | None:
    """The ``host:port`` a prefill instance tells others (its ``/load`` ``pd_addr``, which
    fd-router hands the decode instance in ``x-fd-prefill-addr``): ``--pd-comm-port`` on the
    server's ``--host`` (this machine's name when it listens on every interface), else the
    loopback ``--engine-worker-queue-port``. None for another role or without a port."""
    if (getattr(args, "splitwise_role", None) or "mixed").strip().lower() != "prefill":
        return None
    remote = _one_port(getattr(args, "pd_comm_port", None), "--pd-comm-port")
    if remote:
        import socket

        name = host if host and host not in ("0.0.0.0", "::") else socket.gethostname()
        return f"{name}:{remote[0].rpartition(':')[2]}"
    local = _one_port(getattr(args, "engine_worker_queue_port", None), "--engine-worker-queue-port")
    return f"127.0.0.1:{local[0].rpartition(':')[2]}" if local else None
