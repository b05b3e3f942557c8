"""fd-serve --workers N: several API processes in front of one engine process."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import httpx
import pytest

from .server_process import Server, alive, free_port, gauge, tiny_server_args, wait_for, wait_gone

pytestmark = pytest.mark.slow  # each test starts an engine and two API workers


@pytest.fixture(scope="module")
def model(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


def _start(model, tmp_path, *flags: str) -> Server:
    srv = Server(tiny_server_args(model, "--workers", "2", *flags), tmp_path / "server.log")
    srv.wait_ready()
    return srv


def test_two_workers_share_one_engine_and_stop_together(model, tmp_path):
    srv = _start(model, tmp_path, "--timeout-graceful-shutdown", "120")
    pids = srv.descendants()

    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, dict]:
        resp = await client.post(srv.url + "/v1/completions", json={
            "model": "tiny", "prompt": f"request {i}", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        return resp.headers["x-fd-worker"], resp.json()

    async def many() -> list[tuple[str, dict]]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            return await asyncio.gather(*[one(client, i) for i in range(24)])

    results = asyncio.run(many())
    assert {w for w, _ in results} == {"0", "1"}  # new connections are spread over both workers
    assert all(body["usage"]["completion_tokens"] == 8 for _, body in results)
    # the same greedy request gives the same text whichever worker serves it
    texts = {w: body["choices"][0]["text"] for w, body in asyncio.run(
        _repeat(srv.url, {"model": "tiny", "prompt": "request 3", "max_tokens": 8, "temperature": 0,
                          "ignore_eos": True}))}
    assert len(texts) == 2 and texts["0"] == texts["1"] == results[3][1]["choices"][0]["text"]
    # engine gauges reach every worker; nothing is left running
    wait_for(lambda: gauge(srv, "fastdeploy:num_requests_running") == 0, what="engine idle in /metrics")

    long = {"model": "tiny", "prompt": "hello", "max_tokens": 1500, "ignore_eos": True}
    answers: list[httpx.Response] = []

    async def in_flight() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            answers.extend(await asyncio.gather(*[client.post(srv.url + "/v1/completions", json=long)
                                                  for _ in range(4)]))

    thread = threading.Thread(target=lambda: asyncio.run(in_flight()))
    thread.start()
    wait_for(lambda: gauge(srv, "fastdeploy:num_requests_running") >= 4, what="four requests running")
    srv.signal(signal.SIGTERM)
    thread.join(timeout=120)
    assert srv.wait() == 0, srv.output()
    assert [a.status_code for a in answers] == [200] * 4
    assert all(a.json()["usage"]["completion_tokens"] == 1500 for a in answers)
    assert wait_gone(pids) == [], f"left running: {alive(pids)}"
    srv.stop()


async def _repeat(url: str, body: dict) -> list[tuple[str, dict]]:
    """The same request on fresh connections until both workers have answered it."""
    seen: dict[str, dict] = {}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for _ in range(64):
            resp = await client.post(url + "/v1/completions", json=body)
            seen.setdefault(resp.headers["x-fd-worker"], resp.json())
            if len(seen) == 2:
                break
    return list(seen.items())


def test_one_scrape_shows_the_requests_of_every_worker(model, tmp_path):
    metrics_port = free_port()
    srv = _start(model, tmp_path, "--metrics-port", str(metrics_port))
    body = {"model": "tiny", "prompt": "count me", "max_tokens": 4, "temperature": 0, "ignore_eos": True}

    async def many() -> list[str]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            answers = await asyncio.gather(*[client.post(srv.url + "/v1/completions", json=body) for _ in range(12)])
        assert [a.status_code for a in answers] == [200] * 12
        return [a.headers["x-fd-worker"] for a in answers]

    served = asyncio.run(many()) + asyncio.run(many())
    assert set(served) == {"0", "1"} and len(served) == 24
    # whichever worker answers the scrape (fresh connections reach both), it counts all 24
    scrapes: dict[str, dict[str, float]] = {}
    for _ in range(64):
        resp = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", headers={"Connection": "close"}, timeout=10)
        scrapes[resp.headers["x-fd-worker"]] = _samples(resp.text)
        if len(scrapes) == 2:
            break
    assert set(scrapes) == {"0", "1"}
    for seen in scrapes.values():
        assert seen["fastdeploy:requests_number_total"] == 24
        assert seen['fastdeploy:request_success_total{finished_reason="length"}'] == 24
        assert seen["fastdeploy:generation_tokens_total"] == 24 * 4
        assert seen["fastdeploy:e2e_request_latency_seconds_count"] == 24
        assert seen["fastdeploy:num_requests_running"] == 0 and seen["fastdeploy:max_gpu_block_num"] == 512
        assert "fastdeploy:max_batch_size" in seen  # == --max-num-seqs: test_server_process checks the value
    assert httpx.get(srv.url + "/config-info", timeout=10).json()["server_args"]["workers"] == 2
    # the workers' metric files live in one directory per run, removed when the server exits
    dirs = {_environ(pid).get("PROMETHEUS_MULTIPROC_DIR") for pid in srv.descendants()} - {None}
    assert len(dirs) == 1 and os.listdir(shared := dirs.pop())
    assert srv.stop() == 0, srv.output()
    assert not os.path.exists(shared)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:  # gone, or not ours
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _samples(text: str) -> dict[str, float]:
    """/metrics lines: name{labels} -> value; a series shown twice fails."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            assert series not in out, f"{series} shown twice"
            out[series] = float(value)
    return out


def test_engine_death_stops_every_worker(model, tmp_path):
    srv = _start(model, tmp_path)
    pids = srv.descendants()
    os.kill(srv.engine_pid(), signal.SIGKILL)
    assert srv.wait() == 1, srv.output()
    assert "engine process died" in srv.output()
    assert wait_gone(pids) == [], f"left running: {alive(pids)}"
    srv.stop()


def test_killing_the_main_process_leaves_no_orphans(model, tmp_path):
    srv = _start(model, tmp_path)
    pids = srv.descendants()
    assert len(pids) >= 3  # engine, two workers (and multiprocessing's resource tracker)
    srv.signal(signal.SIGKILL)
    srv.wait()
    assert wait_gone(pids) == [], f"left running: {alive(pids)}"
    srv.stop()
