"""Three fd-serve instances on loopback behind the global scheduler and a real
redis-server (tiny generated checkpoint): one receives every request and the
others take work; a Redis restart mid-load loses nothing; an instance killed
mid-load leaves no request hanging and the others keep serving."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.entrypoints.server_process import Server, alive, tiny_server_args, wait_for, wait_gone

pytestmark = pytest.mark.slow


def _complete(url: str, i: int, max_tokens: int = 24) -> tuple[int, dict]:
    body = {"model": "tiny", "prompt": f"request {i} says", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    return r.status_code, r.json()


def _loads(redis_port: int, topic: str) -> dict[str, dict]:
    import redis

    r = redis.Redis(port=redis_port)
    out = {}
    for key in r.scan_iter(f"fd:{topic}:ins:*"):
        raw = r.get(key)
        if raw:
            out[key.decode().rsplit(":ins:", 1)[1]] = json.loads(raw)
    r.close()
    return out


def test_three_instances_share_work_survive_a_redis_restart_and_an_instance_death(
        checkpoint_factory, redis_server, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    flags = ["--scheduler-name", "global", "--scheduler-port", str(redis_server.port), "--scheduler-topic", "e2e",
             "--scheduler-min-load-score", "1", "--scheduler-expire-period", "1500"]
    servers = [Server(tiny_server_args(model, *flags, "--max-num-seqs", "2"), tmp_path / f"s{i}.log")
               for i in range(3)]
    try:
        for s in servers:
            s.wait_ready(180)
        wait_for(lambda: len(_loads(redis_server.port, "e2e")) == 3, 30, "three instances registered")
        front = servers[0].url
        with ThreadPoolExecutor(16) as pool:
            # 1. skewed: every request to one instance; the others take work; greedy answers agree
            results = list(pool.map(lambda i: _complete(front, i % 4), range(16)))
            assert [code for code, _ in results] == [200] * 16, results
            texts = {}
            for i, (_, body) in enumerate(results):
                texts.setdefault(i % 4, set()).add(body["choices"][0]["text"])
            assert all(len(t) == 1 for t in texts.values()), texts
            wait_for(lambda: sum(v["taken"] for v in _loads(redis_server.port, "e2e").values()) == 16, 10,
                     "the heartbeats count the 16 requests taken")  # a heartbeat is up to 0.5 s old
            loads = _loads(redis_server.port, "e2e")
            assert sum(v["stolen"] for v in loads.values()) > 0, loads

            # 2. Redis restarted mid-load: every request still answers, none lost
            jobs = [pool.submit(_complete, front, 100 + i) for i in range(12)]
            redis_server.restart(down_seconds=1.0)
            assert [j.result()[0] for j in jobs] == [200] * 12, [j.result() for j in jobs]

            # 3. an instance killed mid-load: no request hangs; any that fail say the instance stopped
            victim = servers[2]
            jobs = [pool.submit(_complete, front, 200 + i, 64) for i in range(12)]
            wait_for(lambda: _loads(redis_server.port, "e2e").get(_name(victim), {}).get("executing", 0) > 0,
                     60, "the victim runs a request")
            pids = [victim.proc.pid, *victim.descendants()]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            assert not wait_gone(pids, 30), alive(pids)
            answers = [j.result() for j in jobs]
            for code, body in answers:
                assert code == 200 or "stopped" in json.dumps(body), (code, body)
            assert sum(code == 200 for code, _ in answers) >= 12 - 2  # at most --max-num-seqs were running there
            assert _complete(front, 999)[0] == 200  # the others keep serving
    finally:
        for s in servers:
            s.stop()


def test_api_workers_of_one_server_are_instances_of_their_own(checkpoint_factory, redis_server, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    flags = ["--workers", "2", "--max-num-seqs", "4", "--scheduler-name", "global", "--scheduler-port",
             str(redis_server.port), "--scheduler-topic", "workers", "--scheduler-min-load-score", "1"]
    server = Server(tiny_server_args(model, *flags), tmp_path / "server.log")
    try:
        server.wait_ready(180)
        names = [f"{_name(server)}-w0", f"{_name(server)}-w1"]
        wait_for(lambda: sorted(_loads(redis_server.port, "workers")) == names, 30, "both workers registered")
        assert all(v["capacity"] == 2 for v in _loads(redis_server.port, "workers").values())
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: _complete(server.url, i % 2, 8), range(8)))
        assert [code for code, _ in results] == [200] * 8, results
        assert len({body["choices"][0]["text"] for _, body in results[0::2]}) == 1
        wait_for(lambda: sum(v["taken"] for v in _loads(redis_server.port, "workers").values()) == 8, 10,
                 "the heartbeats count the 8 requests taken")
    finally:
        server.stop()


def _name(server: Server) -> str:
    import socket

    return f"{socket.gethostname()}:{server.port}"
