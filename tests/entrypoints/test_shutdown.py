"""Graceful shutdown of the real server: SIGTERM drains the requests in flight,
aborts those past --timeout-graceful-shutdown with proper errors, and nothing
outlives the server."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import httpx
import pytest

from .server_process import Server, alive, gauge, sse_events, tiny_server_args, wait_for, wait_gone

LONG = 1900  # tokens: seconds of work for the tiny model, so the requests are still running at SIGTERM


@pytest.fixture(scope="module")
def model(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


def _start(model, tmp_path, *flags: str) -> Server:
    srv = Server(tiny_server_args(model, *flags), tmp_path / "server.log")
    srv.wait_ready()
    return srv


class InFlight:
    """One non-streaming completion and one streaming chat, each on its own thread."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.plain: httpx.Response | None = None
        self.stream_status = 0
        self.stream_lines: list[str] = []
        self.errors: list[Exception] = []  # connections cut under a killed server
        self.threads = [threading.Thread(target=self._guard, args=(f,)) for f in (self._plain, self._stream)]
        for t in self.threads:
            t.start()

    def _guard(self, work: Any) -> None:
        try:
            work()
        except httpx.HTTPError as exc:
            self.errors.append(exc)

    def _plain(self) -> None:
        self.plain = httpx.post(self.url + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": "hello", "max_tokens": self.max_tokens, "ignore_eos": True})

    def _stream(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=120) as resp:
            self.stream_status = resp.status_code
            for line in resp.iter_lines():
                self.stream_lines.append(line)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=120)

    def events(self) -> list[Any]:
        return sse_events(self.stream_lines)


def _both_running(server: Server) -> bool:
    return gauge(server, "fastdeploy:num_requests_running") >= 2


def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(model, tmp_path):
    srv = _start(model, tmp_path, "--timeout-graceful-shutdown", "120")
    engine = srv.engine_pid()
    work = InFlight(srv.url, LONG)
    wait_for(lambda: _both_running(srv), what="two requests running")
    srv.signal(signal.SIGTERM)
    wait_for(lambda: httpx.get(srv.url + "/health", timeout=5).status_code == 503, what="/health 503 on drain")
    refused = httpx.post(srv.url + "/v1/completions", timeout=30, json={"model": "tiny", "prompt": "x",
                                                                         "max_tokens": 2})
    assert refused.status_code == 503
    assert "server is shutting down" in refused.json()["error"]["message"]
    work.join()
    assert srv.wait() == 0, srv.output()
    assert not work.errors
    assert work.plain is not None and work.plain.status_code == 200
    done = work.plain.json()
    assert done["choices"][0]["finish_reason"] == "length" and done["usage"]["completion_tokens"] == LONG
    events = work.events()
    assert work.stream_status == 200 and events[-1] == "[DONE]"
    assert not any("error" in e for e in events if isinstance(e, dict))
    assert events[-2]["usage"]["completion_tokens"] == LONG
    assert wait_gone([engine]) == []
    srv.stop()


def test_sigterm_past_the_timeout_aborts_with_errors_and_exits_3(model, tmp_path):
    srv = _start(model, tmp_path, "--timeout-graceful-shutdown", "0.5")
    pids = srv.descendants()
    work = InFlight(srv.url, LONG)
    wait_for(lambda: _both_running(srv), what="two requests running")
    srv.signal(signal.SIGTERM)
    work.join()
    assert srv.wait() == 3, srv.output()
    assert not work.errors
    assert work.plain is not None and work.plain.status_code == 503
    assert work.plain.headers["content-type"] == "application/json"
    error = work.plain.json()["error"]
    assert error["code"] == 503 and "--timeout-graceful-shutdown 0.5" in error["message"]
    events = work.events()
    assert work.stream_status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 503 and "shutting down" in events[-2]["error"]["message"]
    assert any(e.get("choices") for e in events[:-2])  # it had streamed tokens before the cut
    assert wait_gone(pids) == [], srv.output()
    srv.stop()


def test_the_engine_exits_when_the_server_is_killed(model, tmp_path):
    srv = _start(model, tmp_path)
    pids = srv.descendants()
    work = InFlight(srv.url, LONG)  # busy: the engine notices between steps too
    wait_for(lambda: _both_running(srv), what="two requests running")
    sockets = _engine_socket_dirs(pids)
    srv.signal(signal.SIGKILL)
    srv.wait()
    assert wait_gone(pids) == [], f"left running: {alive(pids)}"
    work.join()
    srv.stop()
    assert sockets and not any(os.path.exists(d) for d in sockets)  # the engine removed its socket's directory


def _engine_socket_dirs(pids: list[int]) -> list[str]:
    """The fd-engine-* directories the server's processes have their IPC sockets in
    (/proc/net/unix lists every socket of the machine: keep those these processes hold)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for line in open("/proc/net/unix"):
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "/fd-engine-" in fields[-1]:
            found.add(os.path.dirname(fields[-1]))
    return sorted(found)


