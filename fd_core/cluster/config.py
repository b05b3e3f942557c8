"""``--scheduler-name`` and FastDeploy's ``--scheduler-*`` flags, checked.

FastDeploy's names, defaults and meanings (its scheduler page): ``local``
is one instance's own queue (the default; nothing here runs), ``global``
shares work between the instances of one ``--scheduler-topic`` through a
Redis server, ``splitwise`` (prefill/decode disaggregation) is issue 18
item 2 and refused by name. ``scheduler_config_from`` is called by the CLI
before anything loads; a bad value is a ValueError naming the flag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["GlobalSchedulerConfig", "SCHEDULER_NAMES", "scheduler_config_from"]

SCHEDULER_NAMES = ("local", "global", "splitwise")
_TOPIC = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class GlobalSchedulerConfig:
    """What the global scheduler needs (``--scheduler-*``; FastDeploy's defaults)."""

    host: str = "127.0.0.1"  # --scheduler-host: the Redis server
    port: int = 6379  # --scheduler-port
    db: int = 0  # --scheduler-db: Redis database index
    password: str | None = None  # --scheduler-password ("" = none)
    topic: str = "default"  # --scheduler-topic: only instances of one topic share work
    ttl: int = 900  # --scheduler-ttl: seconds a request may live in Redis (queued, or its results)
    min_load_score: float = 3.0  # --scheduler-min-load-score: an idle instance steals only from a
    #                              queue holding at least this many requests
    load_shards_num: int = 1  # --scheduler-load-shards-num: shards of the instance (load) table
    expire_period_ms: int = 3000  # --scheduler-expire-period: an instance whose heartbeat is older is gone;
    #                              milliseconds, as FastDeploy's code reads it (SplitWiseSchedulerConfig:
    #                              "expire_period=3000,  # ms", divided by 1000) though its scheduler page's
    #                              table says seconds: a FastDeploy launch line keeps its meaning
    instance_name: str | None = None  # this instance's name in Redis (default: host:port of the API)

    def __post_init__(self) -> None:
        _check(isinstance(self.host, str) and bool(self.host.strip()), "--scheduler-host", self.host,
               "a host name or address of the Redis server")
        _check(_is_int(self.port) and 1 <= self.port <= 65535, "--scheduler-port", self.port, "a port 1..65535")
        _check(_is_int(self.db) and 0 <= self.db <= 15, "--scheduler-db", self.db,
               "a Redis database index 0..15")
        _check(self.password is None or isinstance(self.password, str), "--scheduler-password", "***",
               "a string")
        _check(isinstance(self.topic, str) and bool(_TOPIC.match(self.topic)), "--scheduler-topic", self.topic,
               "1 to 64 letters, digits or _ . : -")
        _check(_is_int(self.ttl) and self.ttl >= 1, "--scheduler-ttl", self.ttl, "whole seconds >= 1")
        _check(isinstance(self.min_load_score, (int, float)) and not isinstance(self.min_load_score, bool)
               and 0 <= self.min_load_score < float("inf"), "--scheduler-min-load-score", self.min_load_score,
               "a number >= 0 (0: steal any queued request)")
        _check(_is_int(self.load_shards_num) and 1 <= self.load_shards_num <= 1024,
               "--scheduler-load-shards-num", self.load_shards_num, "a whole number 1..1024")
        _check(_is_int(self.expire_period_ms) and 300 <= self.expire_period_ms <= 3_600_000,
               "--scheduler-expire-period", self.expire_period_ms, "milliseconds 300..3600000")
        _check(self.instance_name is None or (isinstance(self.instance_name, str)
                                              and bool(_TOPIC.match(self.instance_name))),
               "instance name", self.instance_name, "1 to 64 letters, digits or _ . : -")

    @property
    def heartbeat_seconds(self) -> float:
        """How often an instance refreshes its heartbeat: three times per expire period."""
        return self.expire_period_ms / 3000.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, flag: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{flag} {value!r} is not valid: expected {expected}")


def scheduler_config_from(ns: Any) -> GlobalSchedulerConfig | None:
    """The global scheduler's config from parsed flags (an argparse namespace or any
    object with the ``scheduler_*`` attributes); None for ``--scheduler-name local``.
    ValueError for a bad value or ``splitwise`` (not built yet)."""
    name = getattr(ns, "scheduler_name", None) or "local"
    if name not in SCHEDULER_NAMES:
        raise ValueError(f"--scheduler-name {name!r} is not valid: expected one of {', '.join(SCHEDULER_NAMES)}")
    if name == "splitwise":
        raise ValueError("--scheduler-name splitwise: prefill/decode disaggregation is not implemented yet "
                         "(issue 18 item 2); use --scheduler-name global or local")
    if name == "local":
        return None
    defaults = GlobalSchedulerConfig()

    def get(attr: str, default: Any) -> Any:
        value = getattr(ns, attr, None)
        return default if value is None else value

    password = get("scheduler_password", "")
    return GlobalSchedulerConfig(
        host=get("scheduler_host", defaults.host), port=get("scheduler_port", defaults.port),
        db=get("scheduler_db", defaults.db), password=password or None,
        topic=get("scheduler_topic", defaults.topic), ttl=get("scheduler_ttl", defaults.ttl),
        min_load_score=get("scheduler_min_load_score", defaults.min_load_score),
        load_shards_num=get("scheduler_load_shards_num", defaults.load_shards_num),
        expire_period_ms=get("scheduler_expire_period", defaults.expire_period_ms),
        instance_name=getattr(ns, "scheduler_instance_name", None),
    )
