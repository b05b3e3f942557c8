"""Fields fd-core does not serve are a 400 naming them, never dropped; API keys."""

from __future__ import annotations

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from fd_core.entrypoints.openai.unsupported import REFUSED
from tests.entrypoints.openai.conftest import MODEL
from tests.entrypoints.openai.helpers import assert_error

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# field -> a value with an effect fd-core cannot give (chat requests)
REFUSED_VALUES = {
    "structured_outputs": {"regex": "a"},
    "mm_hashes": ["abc"], "mm_processor_kwargs": {"fps": 1}, "include_draft_logprobs": True,
    "disaggregate_info": {"role": "prefill"}, "collect_metrics": True,
    "functions": [{"name": "f"}], "function_call": "auto", "audio": {"voice": "alloy"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "low", "web_search_options": {"search_context_size": "low"}, "verbosity": "low", "store": True,
    "service_tier": "flex", "suffix": "the end",
}


def test_every_refused_field_is_declared_and_tested():
    declared = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    assert set(REFUSED) <= declared
    assert set(REFUSED) == set(REFUSED_VALUES)


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
async def test_refused_field_is_a_400_naming_it(http, name):
    value = REFUSED_VALUES[name]
    path, base = (COMPLETIONS, {"prompt": "hi"}) if name in CompletionRequest.model_fields \
        else (CHAT, {"messages": USER})
    for stream in (False, True):
        r = await http.post(path, json={**base, name: value, "max_tokens": 1, "stream": stream})
        assert assert_error(r, 400, name)["param"] == name


@pytest.mark.parametrize("fmt", [{"type": "json_schema", "json_schema": {"name": "x"}},
                                 {"type": "structural_tag", "structures": [], "triggers": []},
                                 {"type": "yaml"}])
async def test_a_response_format_that_cannot_be_served_is_a_400(http, fmt):
    r = await http.post(CHAT, json={"messages": USER, "response_format": fmt, "max_tokens": 1})
    assert r.status_code == 400, r.text
    ok = await http.post(CHAT, json={"messages": USER, "response_format": {"type": "text"}, "max_tokens": 1})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("part,kind", [
    ({"type": "image_url", "image_url": {"url": "http://x/cat.png"}}, "image_url"),
    ({"type": "video_url", "video_url": {"url": "http://x/cat.mp4"}}, "video_url"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "input_audio"),
    ({"type": "hologram", "data": 1}, "hologram"),
])
async def test_content_parts_a_text_model_cannot_take_are_a_400(http, part, kind):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    r = await http.post(CHAT, json={"messages": messages, "max_tokens": 1})
    error = assert_error(r, 400, kind, "messages[1].content[1]")
    assert error["param"] == "messages[1].content[1]"
    r = await http.post("/tokenize", json={"messages": messages})  # the same rendering path
    assert_error(r, 400, kind)


async def test_several_api_keys_each_work(engine_client):
    args = ServerArgs(served_model_names=(MODEL,), api_keys=("key-one", "key-two"), api_key="key-three")
    assert args.api_keys == ("key-one", "key-two", "key-three")
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,), api_keys=("key-one", "key-two")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        for key in ("key-one", "key-two"):
            r = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        assert_error(await http.get("/v1/models", headers={"Authorization": "Bearer key-three"}), 401, "not valid")
        assert_error(await http.get("/v1/models"), 401, "Bearer")
    with pytest.raises(ValueError, match="--api-key"):
        ServerArgs(api_keys=("ok", ""))
