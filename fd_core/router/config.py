"""``fd-router``'s flags, checked, as one frozen ``RouterConfig``.

FastDeploy's router names where it has them: ``--host``, ``--port``,
``--splitwise``, ``--request-timeout-secs`` (its Python router's flags) and,
from its Go router's config file, the policy names (``round_robin``,
``random``, ``power_of_two``, ``request_num`` = least loaded, ``cache_aware``)
and the health knobs (``--health-check-interval-secs``,
``--health-check-timeout-secs``, ``--health-failure-threshold``,
``--health-success-threshold``, ``--balance-abs-threshold``,
``--balance-rel-threshold``). fd-core's own: ``--instances`` (URLs given at
start), ``--load-poll-interval-secs`` (GET /load of each instance),
``--cache-prefix-chars`` and, to find instances in the global scheduler's
Redis registry, fd-serve's ``--scheduler-host/-port/-db/-password/-topic/
-load-shards-num``. ``parse_args`` is called by ``fd_core.router.cli``; a bad
value is a ValueError naming the flag and what was expected.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["POLICIES", "RouterConfig", "build_parser", "config_from", "normalize_url"]

# FastDeploy's names; least_loaded is ours for request_num
POLICIES = ("round_robin", "random", "power_of_two", "request_num", "least_loaded", "cache_aware")


def normalize_url(url: str, what: str = "instance URL") -> str:
    """``host:port`` or ``http://host:port[/]`` -> ``http://host:port``; a ValueError naming the value
    otherwise."""
    text = url.strip()
    if not text:
        raise ValueError(f"{what} {url!r} is empty; expected http://host:port")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        raise ValueError(f"{what} {url!r} is not valid; expected http://host:port (a scheme of http or https, "
                         "a host and a port, no path)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


@dataclass(frozen=True)
class RouterConfig:
    """What the router needs; each field names its flag."""

    host: str = "0.0.0.0"  # --host
    port: int = 9000  # --port (FastDeploy's default)
    splitwise: bool = False  # --splitwise: prefill/decode pairs instead of mixed instances
    instances: tuple[str, ...] = ()  # --instances: URLs known at start (more come by /register or Redis)
    policy: str = "request_num"  # --policy: mixed instances
    prefill_policy: str = "cache_aware"  # --prefill-policy: prefill instances (--splitwise)
    decode_policy: str = "request_num"  # --decode-policy: decode instances (--splitwise)
    request_timeout_secs: float = 1800.0  # --request-timeout-secs: longest wait for an instance's answer
    #                                        (while streaming: for its next bytes)
    health_check_interval_secs: float = 5.0  # --health-check-interval-secs: GET /health of each instance
    health_check_timeout_secs: float = 5.0  # --health-check-timeout-secs
    health_failure_threshold: int = 3  # --health-failure-threshold: failed checks in a row -> unhealthy
    health_success_threshold: int = 2  # --health-success-threshold: good checks in a row -> healthy again
    load_poll_interval_secs: float = 1.0  # --load-poll-interval-secs: GET /load of each instance
    balance_abs_threshold: float = 2.0  # --balance-abs-threshold: cache_aware keeps its instance while its
    balance_rel_threshold: float = 0.25  # load <= mean * (1 + rel) + abs (--balance-rel-threshold)
    cache_prefix_chars: int = 512  # --cache-prefix-chars: leading prompt text that keys cache_aware
    max_attempts: int = 3  # --max-attempts: instances tried for a request that reached none
    scheduler_host: str | None = None  # --scheduler-host: find instances in the global scheduler's Redis
    scheduler_port: int = 6379  # --scheduler-port
    scheduler_db: int = 0  # --scheduler-db
    scheduler_password: str | None = None  # --scheduler-password
    scheduler_topic: str = "default"  # --scheduler-topic
    scheduler_load_shards_num: int = 1  # --scheduler-load-shards-num
    redis_poll_interval_secs: float = 2.0  # --redis-poll-interval-secs: re-read the Redis registry
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be a port 1..65535, got {self.port!r}")
        object.__setattr__(self, "instances", tuple(normalize_url(u, "--instances URL") for u in self.instances))
        for flag, name in (("--policy", self.policy), ("--prefill-policy", self.prefill_policy),
                           ("--decode-policy", self.decode_policy)):
            if name not in POLICIES:
                raise ValueError(f"{flag} {name!r} is not a policy; expected one of {', '.join(POLICIES)}")
        seconds: list[tuple[str, object]] = [
            ("--request-timeout-secs", self.request_timeout_secs),
            ("--health-check-interval-secs", self.health_check_interval_secs),
            ("--health-check-timeout-secs", self.health_check_timeout_secs),
            ("--load-poll-interval-secs", self.load_poll_interval_secs),
            ("--redis-poll-interval-secs", self.redis_poll_interval_secs)]
        for flag, value in seconds:
            if not _number(value) or not 0 < float(value) < math.inf:  # type: ignore[arg-type]
                raise ValueError(f"{flag} must be a number of seconds > 0, got {value!r}")
        thresholds: list[tuple[str, object]] = [("--balance-abs-threshold", self.balance_abs_threshold),
                                                ("--balance-rel-threshold", self.balance_rel_threshold)]
        for flag, value in thresholds:
            if not _number(value) or not 0 <= float(value) < math.inf:  # type: ignore[arg-type]
                raise ValueError(f"{flag} must be a number >= 0, got {value!r}")
        counts: list[tuple[str, object]] = [("--health-failure-threshold", self.health_failure_threshold),
                                            ("--health-success-threshold", self.health_success_threshold),
                                            ("--cache-prefix-chars", self.cache_prefix_chars),
                                            ("--max-attempts", self.max_attempts),
                                            ("--scheduler-load-shards-num", self.scheduler_load_shards_num)]
        for flag, value in counts:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{flag} must be a whole number >= 1, got {value!r}")
        if self.scheduler_host is not None and not self.scheduler_host.strip():
            raise ValueError("--scheduler-host is empty; expected the Redis server's host name or address")
        if not 1 <= self.scheduler_port <= 65535:
            raise ValueError(f"--scheduler-port must be a port 1..65535, got {self.scheduler_port!r}")

    @property
    def redis_discovery(self) -> bool:
        return self.scheduler_host is not None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)



def build_parser() -> argparse.ArgumentParser:
    """fd-router's argument parser (unknown flags are refused by argparse, by name)."""
    p = argparse.ArgumentParser(prog="fd-router", description="One OpenAI endpoint in front of fd-serve "
                                "instances (mixed, or prefill/decode pairs with --splitwise).")
    d = RouterConfig()
    a = p.add_argument
    a("--host", default=d.host, help="address to listen on")
    a("--port", type=int, default=d.port, help="port to listen on")
    a("--splitwise", action="store_true", help="route to prefill/decode pairs (instances with "
      "--splitwise-role prefill|decode) instead of mixed instances")
    a("--instances", nargs="+", default=[], metavar="URL", help="instance URLs (http://host:port) to route "
      "to from the start; instances may also register with POST /register (fd-serve --router) or be found "
      "in Redis (--scheduler-host)")
    a("--policy", default=d.policy, choices=POLICIES, help="how a mixed instance is picked")
    a("--prefill-policy", default=d.prefill_policy, choices=POLICIES, help="how a prefill instance is picked")
    a("--decode-policy", default=d.decode_policy, choices=POLICIES, help="how a decode instance is picked")
    a("--request-timeout-secs", type=float, default=d.request_timeout_secs)
    a("--health-check-interval-secs", type=float, default=d.health_check_interval_secs)
    a("--health-check-timeout-secs", type=float, default=d.health_check_timeout_secs)
    a("--health-failure-threshold", type=int, default=d.health_failure_threshold)
    a("--health-success-threshold", type=int, default=d.health_success_threshold)
    a("--load-poll-interval-secs", type=float, default=d.load_poll_interval_secs)
    a("--balance-abs-threshold", type=float, default=d.balance_abs_threshold)
    a("--balance-rel-threshold", type=float, default=d.balance_rel_threshold)
    a("--cache-prefix-chars", type=int, default=d.cache_prefix_chars)
    a("--max-attempts", type=int, default=d.max_attempts)
    a("--scheduler-host", default=None, help="Redis server of the global scheduler: route to the instances "
      "registered there (read only)")
    a("--scheduler-port", type=int, default=d.scheduler_port)
    a("--scheduler-db", type=int, default=d.scheduler_db)
    a("--scheduler-password", default=None)
    a("--scheduler-topic", default=d.scheduler_topic)
    a("--scheduler-load-shards-num", type=int, default=d.scheduler_load_shards_num)
    a("--redis-poll-interval-secs", type=float, default=d.redis_poll_interval_secs)
    return p


def config_from(ns: argparse.Namespace) -> RouterConfig:
    """RouterConfig of parsed flags (ValueError names a bad one)."""
    kwargs = {k: v for k, v in vars(ns).items() if k in RouterConfig.__dataclass_fields__ and k != "extra"}
    kwargs["instances"] = tuple(kwargs.get("instances") or ())
    return RouterConfig(**kwargs)
