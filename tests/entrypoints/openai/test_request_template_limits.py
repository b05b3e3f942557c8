"""A request's own chat_template renders in a subprocess with limits: a slow or
memory-hungry template is a 400 naming chat_template, and never stalls the
other requests on the API process's event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.entrypoints.openai.template_sandbox import RequestTemplateRenderer
from fd_core.tokenizer import Tokenizer
from tests.entrypoints.openai.helpers import assert_error
from tests.entrypoints.openai.recording_engine import RecordingEngineClient

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
ECHO = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}!"
# 5000 ** 3 loop steps: minutes of CPU, stopped at the time limit
SLOW = ("{% for a in range(5000) %}{% for b in range(5000) %}{% for c in range(5000) %}"
        "{% endfor %}{% endfor %}{% endfor %}")


class ObservedRenderer(RequestTemplateRenderer):
    """Says when a render has started (in its thread, off the event loop)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rendering = threading.Event()

    def _render_blocking(self, job: tuple[Any, ...]) -> str:
        self.rendering.set()
        return super()._render_blocking(job)


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch"))


@pytest.fixture(scope="module")
def renderer():
    renderer = ObservedRenderer(timeout_s=2.0)  # ample for the requests served meanwhile
    yield renderer
    renderer.close()


@pytest.fixture
def client(tokenizer):
    return RecordingEngineClient(tokenizer)


@pytest.fixture
async def http(client, renderer):
    app = build_app(client, ServerArgs())
    app.state.fd.chat.template_renderer = renderer
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        yield http


def chat(template: str) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 1, "chat_template": template}


async def test_a_slow_template_is_stopped_and_others_are_served_meanwhile(http, client, renderer):
    finished: list[str] = []

    async def call(name: str, method: str, path: str, body: Any = None) -> httpx.Response:
        r = await http.request(method, path, json=body)
        finished.append(name)
        return r

    renderer.rendering.clear()
    slow = asyncio.create_task(call("slow", "POST", CHAT, chat(SLOW)))
    while not renderer.rendering.is_set():  # the slow render is under way
        await asyncio.sleep(0.01)
    health = await call("health", "GET", "/health")
    plain = await call("plain", "POST", CHAT, {"messages": USER, "max_tokens": 1})
    r = await slow
    assert finished == ["health", "plain", "slow"]
    assert health.status_code == 200 and plain.status_code == 200, plain.text
    error = assert_error(r, 400, "chat_template", "exceeded the time limit of 2 s")
    assert error["param"] == "chat_template"
    # the killed subprocess is replaced: the next request template renders
    started = renderer.processes_started
    r = await http.post(CHAT, json=chat(ECHO))
    assert r.status_code == 200, r.text
    assert client.prompts[-1] == client.tokenizer.encode("<user>hi!")
    assert renderer.processes_started == started + 1


async def test_memory_bombs_are_400(http, renderer):
    r = await http.post(CHAT, json=chat("{{ 'a' * 10**10 }}"))
    error = assert_error(r, 400, "TemplateLimitError", "10000000000 items")
    assert error["param"] == "chat_template"
    # not caught by the `*` check: the subprocess's memory cap stops it (on a loaded machine
    # faulting in 900 MB can take longer than the 2 s time limit, which then stops it first)
    r = await http.post(CHAT, json=chat("{{ '%0900000000d' % 1 }}"))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "chat_template"
    assert ("exceeded the memory limit of 1024 MiB" in error["message"]
            or "exceeded the time limit of 2 s" in error["message"]), error


async def test_concurrent_request_templates_all_render(http, client):
    templates = [ECHO.replace("!", f"#{i}") for i in range(6)]
    answers = await asyncio.gather(*(http.post(CHAT, json=chat(t)) for t in templates))
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    expected = sorted(client.tokenizer.encode(f"<user>hi#{i}") for i in range(6))
    assert sorted(client.prompts[-6:]) == expected


def _state(pid: int) -> str | None:
    """The process state letter (``Z``: exited, not yet reaped), None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_render_subprocess_ends_when_the_api_process_is_killed():
    script = textwrap.dedent("""
        import asyncio, os, signal
        from fd_core.entrypoints.openai.template_sandbox import RequestTemplateRenderer
        r = RequestTemplateRenderer()
        asyncio.run(r.render("x", None, [{"role": "user", "content": "a"}], True, None, {}))
        print(r._process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no exit hooks run
    """)
    api = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                           cwd=Path(__file__).parents[3])
    child = int(api.stdout.readline())
    api.wait(30)
    api.stdout.close()
    deadline = time.monotonic() + 30
    while _state(child) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(child) in (None, "Z")
