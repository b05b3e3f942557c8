"""fd-router --splitwise in front of a real prefill and a real decode instance (FastDeploy's
single-machine PD lines): the prefill instance reports its KV-transfer address in /load, the
router hands it to the decode instance in x-fd-prefill-addr, and the answers, streamed or not,
equal a mixed instance's, with the KV bytes in the usage."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.disagg.test_servers import PROMPTS, _complete
from tests.entrypoints.server_process import Server, free_port, tiny_server_args, wait_for

pytestmark = pytest.mark.slow


def test_router_pairs_a_prefill_and_a_decode_instance(checkpoint_factory, tmp_path, monkeypatch):
    model = checkpoint_factory("tiny-dense", "pytorch")
    monkeypatch.setenv("FD_PD_ALLOWED_PREFILL_ADDRS", "*")  # the router names the prefill instance
    queue_port = free_port()
    prefill = Server(tiny_server_args(model, "--engine-worker-queue-port", str(queue_port),
                                      "--splitwise-role", "prefill"), tmp_path / "prefill.log")
    decode = Server(tiny_server_args(model, "--engine-worker-queue-port", str(free_port()),
                                     "--innode-prefill-ports", str(free_port()), "--splitwise-role", "decode"),
                    tmp_path / "decode.log")
    mixed = Server(tiny_server_args(model), tmp_path / "mixed.log")
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "router.log", "w")
    router = subprocess.Popen([sys.executable, "-m", "fd_core.router.cli", "--host", "127.0.0.1", "--port",
                               str(port), "--splitwise", "--instances", prefill.url, decode.url,
                               "--health-check-interval-secs", "0.5", "--load-poll-interval-secs", "0.5"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for s in (prefill, decode, mixed):
            s.wait_ready(180)
        load = httpx.get(prefill.url + "/load", timeout=5).json()
        assert (load["role"], load["pd_addr"]) == ("prefill", f"127.0.0.1:{queue_port}")
        assert httpx.get(decode.url + "/load", timeout=5).json()["role"] == "decode"

        def ready() -> bool:
            try:
                health = httpx.get(router_url + "/health", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return False
            return health.get("prefill") == 1 and health.get("decode") == 1
        wait_for(ready, 60, "the prefill and decode instances usable through the router")
        # the decode instance's own --innode-prefill-ports names a dead port: every answer
        # below went through the prefill instance the router chose
        for prompt in PROMPTS:
            for stream in (False, True):
                text, used = _complete(router_url, prompt, stream)
                expected, _ = _complete(mixed.url, prompt, stream)
                assert text == expected, (prompt, stream)
                assert used["kv_transfer_bytes"] > 0  # the prompt's last block always comes from the prefill side
    finally:
        for s in (prefill, decode, mixed):
            s.stop()
        router.terminate()
        router.wait(timeout=30)
        log.close()
