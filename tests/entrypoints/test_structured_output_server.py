"""Structured output through the real fd-serve: the engine in its own process
(MPEngineClient, the default path), so constraints, compile errors and
grammar verdicts cross the process boundary. On the random-weight tiny model
(only the constraint makes outputs valid) and on a scripted thinking model
(the constraint starts after ``</think>``; ``reasoning_max_tokens`` first)."""

from __future__ import annotations

import importlib.util
import json
import re

import httpx
import jsonschema
import pytest

from tests.entrypoints.server_process import Server, tiny_server_args

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["a", "b"]}},
          "required": ["id", "tag"], "additionalProperties": False}
USER = [{"role": "user", "content": "JSON please"}]


@pytest.fixture(scope="module")
def server(checkpoint_factory, tmp_path_factory):
    srv = Server(tiny_server_args(checkpoint_factory("tiny-dense", "pytorch"),
                                  "--guided-decoding-disable-any-whitespace"),
                 tmp_path_factory.mktemp("structured") / "server.log")
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()


def chat(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": USER, **body}, timeout=120)


def streamed(url: str, body: dict) -> tuple[str, str, str | None]:
    reasoning, content, finish = "", "", None
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "messages": USER, **body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    reasoning += choice["delta"].get("reasoning_content") or ""
                    content += choice["delta"].get("content") or ""
                    finish = choice.get("finish_reason") or finish
    return reasoning, content, finish


def test_json_schema_batched_with_unconstrained_requests_streaming_and_not(server):
    import concurrent.futures as cf

    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    with cf.ThreadPoolExecutor(6) as pool:
        plain = [pool.submit(chat, server.url, {"max_tokens": 16, "seed": i}) for i in range(3)]
        guided = [pool.submit(chat, server.url, {"response_format": fmt, "max_tokens": 60, "seed": i})
                  for i in range(3)]
        stream = pool.submit(streamed, server.url, {"response_format": fmt, "max_tokens": 60, "seed": 9})
    for f in plain:
        assert f.result().status_code == 200
    done = 0
    for f in guided:
        choice = f.result().json()["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
            done += 1
    assert done >= 2
    _, content, finish = stream.result()
    if finish == "stop":
        jsonschema.validate(json.loads(content), SCHEMA)


def test_a_schema_the_engine_cannot_compile_is_a_400_from_the_engine_process(server):
    r = chat(server.url, {"guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}, "max_tokens": 5})
    assert r.status_code == 400 and "strin" in r.text, r.text
    r = chat(server.url, {"guided_regex": "[0-9]{3}", "max_tokens": 10})  # the engine still serves
    assert re.fullmatch("[0-9]{3}", r.json()["choices"][0]["message"]["content"]), r.text


TAG = {"type": "structural_tag", "triggers": ["<fn="],
       "structures": [{"begin": "<fn=sum>", "schema": {"type": "object", "properties": {
           "x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"],
           "additionalProperties": False}, "end": "</fn>"}]}


def test_structural_tag_is_served_and_a_bad_one_is_a_400(server):
    r = chat(server.url, {"response_format": TAG, "max_tokens": 20, "seed": 1})
    assert r.status_code == 200, r.text  # free text (the random model rarely writes the trigger)
    bad = {**TAG, "structures": [{**TAG["structures"][0], "begin": "<tool>"}]}
    r = chat(server.url, {"response_format": bad, "max_tokens": 5})
    assert r.status_code == 400 and "triggers" in r.text, r.text


@pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="xgrammar is not installed")
def test_xgrammar_backend_per_request(server):
    r = chat(server.url, {"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar", "max_tokens": 60, "seed": 4})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), choice
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    r = chat(server.url, {"guided_choice": ["north", "south"], "guided_decoding_backend": "xgrammar",
                          "max_tokens": 10})
    assert r.json()["choices"][0]["message"]["content"] in ("north", "south"), r.text


# --------------------------------------------------------------- thinking model

REASONING = 'Let me think it over carefully.\n</think>\n\nmaybe <fn=sum>{"x": 77}</fn> done'


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    scripted = pytest.importorskip("fd_scripted_model", reason="pip install tests/plugins/fd_scripted_model")
    model = scripted.make_checkpoint(tmp_path_factory.mktemp("scripted") / "model", REASONING)
    srv = Server(["--model", str(model), "--backend", "cpu", "--max-model-len", "512",
                  "--num-gpu-blocks-override", "64", "--block-size", "16", "--served-model-name", "tiny",
                  "--reasoning-parser", "ernie_x1"],
                 tmp_path_factory.mktemp("log") / "server.log")
    srv.wait_ready()
    yield srv
    srv.stop()


def test_the_constraint_starts_after_the_reasoning(thinking_server):
    """The script's reasoning is not in the choice language, so it ran unconstrained;
    its answer "maybe" is not either, so the answer was constrained."""
    body = {"guided_choice": ["yes", "no"], "max_tokens": 60, "temperature": 0}
    message = chat(thinking_server.url, body).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me think it over carefully."
    assert message["content"] in ("yes", "no")
    assert streamed(thinking_server.url, body)[:2] == (message["reasoning_content"], message["content"])


def test_reasoning_max_tokens_ends_the_thinking_then_the_constraint_holds(thinking_server):
    body = {"guided_choice": ["yes", "no"], "max_tokens": 60, "temperature": 0, "reasoning_max_tokens": 3}
    choice = chat(thinking_server.url, body).json()["choices"][0]
    assert choice["message"]["content"] in ("yes", "no"), choice
    assert "carefully" not in (choice["message"]["reasoning_content"] or "")  # cut after 3 tokens


def test_structural_tag_after_the_reasoning_holds_the_tagged_part_to_its_schema(thinking_server):
    """The script writes the tag with x = 77; the schema allows 0-9 only."""
    body = {"response_format": TAG, "max_tokens": 60, "temperature": 0}
    choice = chat(thinking_server.url, body).json()["choices"][0]
    assert choice["message"]["reasoning_content"] == "Let me think it over carefully."
    content = choice["message"]["content"]
    tagged = re.search(r"<fn=sum>(.*?)</fn>", content, re.S)
    assert content.startswith("maybe <fn=sum>") and tagged, content
    assert json.loads(tagged.group(1))["x"] in range(10), content
