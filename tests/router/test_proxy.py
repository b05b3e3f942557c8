"""The router in front of fake instances (real HTTP on loopback): forwarding, streaming
pass-through, retries, unhealthy marking, registration, prefill/decode pairs."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.router.fakes import free_port, registered, wait_for

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _events(text: str) -> list[str]:
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]


def test_a_request_is_forwarded_and_the_answer_names_its_instance(fakes, router):
    a = fakes("a")
    r = router(instances=(a.url,))
    resp = httpx.post(r.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert resp.status_code == 200 and resp.json()["instance"] == "a"
    assert resp.headers["x-fd-instance"] == a.url and resp.headers["x-request-id"] == "req-1"
    assert a.received[0]["path"] == "/v1/completions" and a.received[0]["body"]["prompt"] == "x"
    models = httpx.get(r.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiny"
    metrics = httpx.get(r.url + "/metrics", timeout=10).text
    assert f'fd_router_requests_total{{url="{a.url}",role="mixed"}} 2' in metrics
    assert f'fd_router_instance_healthy{{url="{a.url}",role="mixed"}} 1' in metrics


def test_an_instances_error_answer_passes_through(fakes, router):
    a = fakes("a")
    a.status = 400
    r = router(instances=(a.url,))
    resp = httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert resp.status_code == 400 and "a refuses" in resp.text
    assert len(a.received) == 1  # not retried: the instance answered


def test_streaming_passes_through_chunk_by_chunk(fakes, router):
    a = fakes("a", chunks=3)
    a.gate = threading.Event()  # the instance sends chunk 0, then waits until the client has it
    r = router(instances=(a.url,))
    with httpx.stream("POST", r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first.removeprefix("data: ")) == {"instance": "a", "i": 0}
        a.gate.set()
        rest = [line for line in lines if line]
    assert [json.loads(x.removeprefix("data: "))["i"] for x in rest[:-1]] == [1, 2]
    assert rest[-1] == "data: [DONE]"


def test_a_stream_that_breaks_ends_with_an_error_event(fakes, router):
    a = fakes("a", chunks=4)
    a.die_after = 2
    r = router(instances=(a.url,))
    resp = httpx.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
    events = _events(resp.text)
    assert [json.loads(e)["i"] for e in events[:2]] == [0, 1]
    error = json.loads(events[2])["error"]
    assert error["code"] == 502 and a.url in error["message"] and "streaming" in error["message"]
    assert events[3] == "[DONE]"


def test_a_request_that_reaches_no_instance_is_retried_on_another_and_the_dead_one_marked(fakes, router):
    a = fakes("a")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = router(instances=(dead, a.url), policy="round_robin", health_failure_threshold=100,
               health_check_interval_secs=60)
    for _ in range(4):
        resp = httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert resp.status_code == 200 and resp.json()["instance"] == "a"
    state = registered(r.url)
    assert state[dead]["healthy"] is False and "cannot connect" in state[dead]["last_error"]
    assert state[a.url]["healthy"] is True


def test_a_503_before_any_byte_is_retried_and_marks_the_instance(fakes, router):
    a, b = fakes("a"), fakes("b")
    a.status = 503
    r = router(instances=(a.url, b.url), policy="round_robin", health_check_interval_secs=60)
    answers = [httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10).json()["instance"]
               for _ in range(3)]
    assert answers == ["b", "b", "b"]
    assert len(a.received) == 1  # tried once, then left alone
    assert registered(r.url)[a.url]["healthy"] is False


def test_when_no_instance_can_take_it_the_client_gets_503_saying_why(fakes, router):
    dead = f"http://127.0.0.1:{free_port()}"
    r = router(instances=(dead,), health_check_interval_secs=60)
    resp = httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert resp.status_code == 503 and dead in resp.json()["error"]["message"]
    health = httpx.get(r.url + "/health", timeout=10)
    assert health.status_code == 503 and "no usable mixed instance" in health.json()["error"]["message"]


def test_health_checks_mark_an_instance_unhealthy_and_healthy_again(fakes, router):
    a, b = fakes("a"), fakes("b")
    r = router(instances=(a.url, b.url))
    assert httpx.get(r.url + "/health", timeout=5).json() == {"status": "ok", "mixed": 2}
    a.health_status = 500
    wait_for(lambda: registered(r.url)[a.url]["healthy"] is False, what="a unhealthy")
    assert "/health answered 500" in registered(r.url)[a.url]["last_error"]
    answers = {httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10).json()["instance"]
               for _ in range(4)}
    assert answers == {"b"}
    a.health_status = 200
    wait_for(lambda: registered(r.url)[a.url]["healthy"] is True, what="a healthy again")


def test_the_load_an_instance_reports_steers_least_loaded(fakes, router):
    a, b = fakes("a"), fakes("b")
    a.running, a.waiting = 5, 3
    r = router(instances=(a.url, b.url), policy="request_num")
    wait_for(lambda: registered(r.url)[a.url]["running"] == 5, what="a's load polled")
    answers = Counter(httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10).json()["instance"]
                      for _ in range(6))
    assert answers == {"b": 6}
    state = registered(r.url)[a.url]
    assert (state["waiting"], state["free_blocks"], state["total_blocks"]) == (3, 10, 16)


def test_least_loaded_spreads_concurrent_requests_by_the_routers_own_count(fakes, router):
    a, b = fakes("a"), fakes("b")
    a.delay = b.delay = 0.1
    r = router(instances=(a.url, b.url), policy="least_loaded", load_poll_interval_secs=60)
    with ThreadPoolExecutor(6) as pool:
        answers = Counter(pool.map(lambda _: httpx.post(r.url + "/v1/completions", json={"prompt": "p"},
                                                        timeout=10).json()["instance"], range(6)))
    assert answers == {"a": 3, "b": 3}


def test_cache_affinity_keeps_a_shared_prefix_on_one_instance(fakes, router):
    insts = [fakes(n) for n in "abc"]
    r = router(instances=tuple(i.url for i in insts), policy="cache_aware")
    system = "You are the assistant of shop %d. Answer briefly and politely, in English. " * 3
    where: dict[int, set[str]] = {}
    for i in range(12):
        shop = i % 3
        body = {"model": "tiny", "messages": [{"role": "system", "content": system % ((shop,) * 3)},
                                              {"role": "user", "content": f"question {i}"}]}
        where.setdefault(shop, set()).add(httpx.post(r.url + "/v1/chat/completions", json=body,
                                                     timeout=10).json()["instance"])
    assert all(len(v) == 1 for v in where.values()), where
    assert len(set().union(*where.values())) == 3  # three prefixes, three instances


def test_instances_register_themselves_fastdeploy_style(fakes, router):
    a = fakes("a")
    r = router()
    assert httpx.get(r.url + "/health", timeout=5).status_code == 503
    ok = httpx.post(r.url + "/register", json={"role": "mixed", "host_ip": "127.0.0.1", "port": a.server.port},
                    timeout=10)
    assert ok.status_code == 200 and ok.json()["url"] == a.url
    assert httpx.post(r.url + "/register", json={"url": a.url}, timeout=10).status_code == 200  # a repeat
    assert httpx.get(r.url + "/registered_number", timeout=5).json() == {"mixed": 1, "prefill": 0, "decode": 0}
    assert registered(r.url)[a.url]["source"] == "register"
    assert httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10).json()["instance"] == "a"


def test_registration_is_refused_by_name(fakes, router):
    a = fakes("a")
    r = router()
    cases = [({"role": "prefill", "url": a.url}, "its role is prefill"),
             ({"role": "leader", "url": a.url}, "'leader'"),
             ({"role": "mixed", "host_ip": "127.0.0.1", "port": "x"}, "'127.0.0.1:x'"),
             ({"role": "mixed", "url": f"127.0.0.1:{free_port()}"}, "not healthy")]
    for body, message in cases:
        resp = httpx.post(r.url + "/register", json=body, timeout=10)
        assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text
    assert registered(r.url) == {}


def test_splitwise_sends_to_a_decode_instance_with_the_prefill_instances_address(fakes, router):
    p1 = fakes("p1", role="prefill", pd_addr="127.0.0.1:7001")
    d1 = fakes("d1", role="decode")
    r = router(splitwise=True)
    for inst, role in ((p1, "prefill"), (d1, "decode")):
        assert httpx.post(r.url + "/register", json={"role": role, "url": inst.url}, timeout=10).status_code == 200
    resp = httpx.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
    assert resp.headers["x-fd-instance"] == d1.url and resp.headers["x-fd-prefill-instance"] == p1.url
    assert _events(resp.text)[-1] == "[DONE]"
    assert p1.received == [] and d1.received[0]["headers"]["x-fd-prefill-addr"] == "127.0.0.1:7001"
    assert httpx.get(r.url + "/health", timeout=5).json() == {"status": "ok", "prefill": 1, "decode": 1}
    mixed = fakes("m")
    refused = httpx.post(r.url + "/register", json={"role": "mixed", "url": mixed.url}, timeout=10)
    assert refused.status_code == 400 and "--splitwise" in refused.text


def test_splitwise_without_a_ready_prefill_instance_says_so(fakes, router):
    p1 = fakes("p1", role="prefill", pd_addr=None)  # its transfer address is not known yet
    d1 = fakes("d1", role="decode")
    r = router(splitwise=True, instances=(p1.url, d1.url))
    wait_for(lambda: registered(r.url)[p1.url]["role"] == "prefill", what="roles polled")
    resp = httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert resp.status_code == 503 and "no pd_addr" in resp.json()["error"]["message"]
    assert d1.received == []


def test_a_429_is_tried_elsewhere_without_marking_the_instance(fakes, router):
    a, b = fakes("a"), fakes("b")
    a.status = 429
    r = router(instances=(a.url, b.url), policy="round_robin", health_check_interval_secs=60)
    answers = [httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10).json()["instance"]
               for _ in range(2)]
    assert answers == ["b", "b"] and len(a.received) >= 1  # a stays in the rotation: 429 is passing
    assert registered(r.url)[a.url]["healthy"] is True
    b.status = 429  # every instance refuses: the client gets the last refusal as it was
    resp = httpx.post(r.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert resp.status_code == 429 and "refuses" in resp.text


def test_a_client_that_goes_away_closes_the_instances_stream(fakes, router):
    a = fakes("a", chunks=3)
    a.gate = threading.Event()  # never set: the instance holds the stream open after chunk 0
    r = router(instances=(a.url,))
    with httpx.stream("POST", r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10) as resp:
        lines = resp.iter_lines()  # kept: a dropped line iterator closes the connection
        next(line for line in lines if line)
        time.sleep(0.2)
        assert a.active == 1 and registered(r.url)[a.url]["in_flight"] == 1
    wait_for(lambda: a.active == 0, what="the instance's stream closed")
    wait_for(lambda: registered(r.url)[a.url]["in_flight"] == 0, what="the router's count released")


def test_a_client_that_leaves_before_the_first_byte_releases_the_instance(fakes, router):
    a = fakes("a", chunks=3)
    a.headers_gate = threading.Event()  # the instance answers only once the client has gone
    a.gate = threading.Event()  # and then holds its stream open after chunk 0
    r = router(instances=(a.url,))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=0.5)
    assert registered(r.url)[a.url]["in_flight"] == 1
    a.headers_gate.set()
    wait_for(lambda: registered(r.url)[a.url]["in_flight"] == 0, what="the router's count released")
    wait_for(lambda: a.active == 0, what="the instance's stream closed")


def test_forwarding_cancelled_before_the_answer_uncounts_the_request():
    """The router's own handler cancelled while the instance has not answered (the server shutting
    down, the client's task torn down): the instance's in-flight count goes back down."""
    import asyncio

    from fd_core.router.config import RouterConfig
    from fd_core.router.proxy import Proxy
    from fd_core.router.registry import Registry

    async def main() -> tuple[int, int]:
        never = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            await never.wait()
            return httpx.Response(200)

        config = RouterConfig(instances=("http://a:1",))
        registry = Registry(config)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            proxy = Proxy(config, registry, client)
            task = asyncio.ensure_future(proxy.forward("POST", "/v1/completions", b"{}", {}))
            await asyncio.sleep(0.05)
            during = registry.instances["http://a:1"].in_flight
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return during, registry.instances["http://a:1"].in_flight

    assert asyncio.run(main()) == (1, 0)
