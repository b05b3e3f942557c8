"""The soak: fd-serve under 30 minutes (--soak-seconds) of mixed traffic with client
disconnects, slow uploads and hostile requests loses no request, answers no 5xx,
comes back to idle, keeps its memory flat, and stops with nothing left behind.

    pytest tests/soak/test_soak.py -m slow --soak-seconds 180   # a quick run
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fd_core.testing.soak import SoakConfig, run_soak
from tests.entrypoints.server_process import Server, alive, tiny_server_args, wait_gone

pytestmark = pytest.mark.slow

BODY_LIMIT = 2 << 20  # --max-request-body-bytes: oversized bodies stay cheap to send
# Resident memory each process may gain over the measured run (after warm-up), comparing
# the median of its first quarter of samples with that of its last quarter: medians ride
# over the allocators' swings (single samples jump by 20+ MiB and fall back), a leak moves
# the whole band. 16 MiB over the ~20,000 requests of 30 minutes is under 1 KB a request:
# the engine's 1.3 KB a request of issue 14 (item 9) fails it.
RSS_GROWTH_MIB = 16.0


def test_soak(checkpoint_factory, tmp_path, request):
    seconds = request.config.getoption("--soak-seconds", default=1800.0)
    workers = request.config.getoption("--soak-workers", default=2)
    clients = request.config.getoption("--soak-clients", default=8)
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(tiny_server_args(model, "--workers", str(workers), "--max-request-body-bytes", str(BODY_LIMIT)),
                 tmp_path / "server.log")
    try:
        srv.wait_ready()
        pids = srv.descendants()
        report = asyncio.run(run_soak(SoakConfig(
            url=srv.url, seconds=seconds, clients=clients, model="tiny", max_model_len=2048,
            max_body_bytes=BODY_LIMIT, pid=srv.proc.pid, rss_growth_mib=RSS_GROWTH_MIB)))
    finally:
        code = srv.stop()
    summary = json.dumps(report.as_dict(), indent=1)
    (tmp_path / "soak.json").write_text(summary)
    print(summary)

    traffic = [p for p in report.problems if not p.startswith(("settle", "rss"))]
    assert traffic == [], f"{len(traffic)} requests lost, 5xx or answered wrongly:\n" + "\n".join(traffic[:40])
    assert sum(v for k, v in report.outcomes.items() if k.endswith(" ok")) > 0
    assert any(k.endswith("disconnected") for k in report.outcomes)  # the mix did reach every kind
    assert any(k.startswith("hostile 4") for k in report.outcomes)
    assert any(k.startswith("upload-") for k in report.outcomes)
    for phase in ("warm", "end"):
        assert report.idle[phase] == {"fastdeploy:num_requests_running": 0.0, "fastdeploy:num_requests_waiting": 0.0,
                                      "fastdeploy:gpu_cache_usage_perc": 0.0}, phase
    rss = [p for p in report.problems if p.startswith("rss")]
    assert rss == [], "\n".join(rss) + f"\n{report.as_dict()['rss_mib']}"
    assert code == 0, srv.output()[-3000:]
    assert wait_gone(pids, timeout=30) == [], f"left running after the server stopped: {alive(pids)}"
