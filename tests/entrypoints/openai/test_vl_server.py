"""ERNIE-4.5-VL behind the OpenAI server (the generated ``tiny-vl`` checkpoint): image_url content
parts as data: URLs give HF transformers' greedy tokens and logprobs; --limit-mm-per-prompt, bad
images, local files and http(s) URLs without their flags, and undecodable video parts are 400s naming the part,
and the engine keeps serving after each."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.multimodal.options import MultiModalOptions
from tests.entrypoints.openai.helpers import GREEDY, assert_error

Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.anyio
NEW_TOKENS = 6


def _png(seed: int, size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(*parts: dict, **extra) -> dict:
    return {"model": "vl", "messages": [{"role": "user", "content": list(parts)}], "max_tokens": NEW_TOKENS,
            **GREEDY, **extra}


def _app(client, tmp_path=None, **flags):
    options = MultiModalOptions.from_flags(**flags)
    return build_app(client, ServerArgs(served_model_names=("vl",), mm_options=options))


async def _post(app, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        return await http.post("/v1/chat/completions", json=body)


async def test_image_data_url_matches_hf(vl_client, vl_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fd_core.models.config import load_config
    from fd_core.multimodal import ImageProcessor
    from tests.models.test_ernie4_5_vl_vs_hf import _hf_greedy

    app = _app(vl_client, limit_mm_per_prompt={"image": 2})
    images = [_png(1, (64, 40)), _png(2, (56, 84))]
    r = await _post(app, _chat(_image_part(_data_url(images[0])), {"type": "text", "text": "and"},
                               _image_part(_data_url(images[1])), {"type": "text", "text": "compare them"},
                               logprobs=True, return_token_ids=True))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    config = load_config(vl_dir)
    processor = ImageProcessor.from_dir(vl_dir)
    processed = [processor(data) for data in images]
    prompt = message["prompt_token_ids"]
    assert prompt.count(config.image_token_id) == sum(p.num_tokens for p in processed)
    assert r.json()["usage"]["prompt_tokens"] == len(prompt)
    hf = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.float32).eval()
    want, want_lp = _hf_greedy(hf, config, prompt, processed)
    assert message["completion_token_ids"] == want[:NEW_TOKENS]
    got_lp = [entry["logprob"] for entry in r.json()["choices"][0]["logprobs"]["content"]]
    np.testing.assert_allclose(got_lp, want_lp[:NEW_TOKENS], atol=1e-3, rtol=0)


async def test_streaming_with_an_image(vl_client):
    app = _app(vl_client)
    r = await _post(app, _chat(_image_part(_data_url(_png(3, (60, 60)))), {"type": "text", "text": "hi"},
                               stream=True))
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text


async def test_limit_mm_per_prompt_is_a_400_naming_the_part(vl_client):
    app = _app(vl_client, limit_mm_per_prompt={"image": 1})
    url = _data_url(_png(4, (56, 56)))
    r = await _post(app, _chat(_image_part(url), {"type": "text", "text": "x"}, _image_part(url)))
    error = assert_error(r, 400, "messages[0].content[2]", "--limit-mm-per-prompt", "1 image")
    assert error["param"] == "messages[0].content[2]"
    r = await _post(_app(vl_client, limit_mm_per_prompt={"image": 0}), _chat(_image_part(url)))
    assert_error(r, 400, "over the limit of 0")


@pytest.mark.parametrize("url, words", [
    (_data_url(b"this is not an image"), ["messages[0].content[0]", "cannot be decoded"]),
    (_data_url(_png(5, (64, 64))[:80]), ["messages[0].content[0]", "cannot be decoded"]),
    ("data:image/png;base64,@@@not-base64@@@", ["base64 payload cannot be decoded"]),
    ("data:image/png,rawbytes", ["must be base64 encoded"]),
    (_data_url(_png(6, (1000, 2))), ["aspect ratio"]),
    ("file:///etc/hostname", ["local image files", "--allowed-local-media-path"]),
    ("/etc/hostname", ["local image files"]),
    ("https://example.com/cat.png", ["--allowed-media-domains"]),
    ("ftp://example.com/cat.png", ["scheme 'ftp'"]),
])
async def test_bad_images_are_400s_and_the_engine_keeps_serving(vl_client, url, words):
    app = _app(vl_client)
    r = await _post(app, _chat(_image_part(url), {"type": "text", "text": "what?"}))
    error = assert_error(r, 400, *words)
    assert error["param"] == "messages[0].content[0]"
    r = await _post(app, _chat(_image_part(_data_url(_png(7, (56, 56)))), {"type": "text", "text": "ok"}))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("part, words", [
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, ["video bytes", "cannot be decoded"]),
    ({"type": "input_audio", "input_audio": {"data": "AAAA"}}, ["media type this model does not take"]),
    ({"type": "image_url", "image_url": {}}, ["needs its image as a URL string"]),
    ({"type": "hologram"}, ["unknown part type"]),
])
async def test_parts_this_model_cannot_take(vl_client, part, words):
    r = await _post(_app(vl_client), _chat({"type": "text", "text": "look"}, part))
    error = assert_error(r, 400, "messages[0].content[1]", *words)
    assert error["param"] == "messages[0].content[1]"


async def test_a_placeholder_typed_as_text_is_a_400(vl_client):
    r = await _post(_app(vl_client), _chat({"type": "text", "text": "<|IMAGE_PLACEHOLDER|> hi"},
                                           _image_part(_data_url(_png(8, (56, 56))))))
    assert_error(r, 400, "image placeholder")


async def test_local_files_under_the_allowed_path(vl_client, tmp_path):
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "cat.png").write_bytes(_png(9, (60, 60)))
    (tmp_path / "secret.png").write_bytes(_png(9, (60, 60)))
    app = _app(vl_client, allowed_local_media_path=str(tmp_path / "media"))
    by_file = await _post(app, _chat(_image_part(f"file://{tmp_path}/media/cat.png"), return_token_ids=True))
    by_data = await _post(app, _chat(_image_part(_data_url(_png(9, (60, 60)))), return_token_ids=True))
    assert by_file.status_code == 200, by_file.text
    assert (by_file.json()["choices"][0]["message"]["completion_token_ids"]
            == by_data.json()["choices"][0]["message"]["completion_token_ids"])
    r = await _post(app, _chat(_image_part(f"file://{tmp_path}/media/../secret.png")))
    assert_error(r, 400, "outside --allowed-local-media-path")
    r = await _post(app, _chat(_image_part(f"file://{tmp_path}/media/missing.png")))
    assert_error(r, 400, "does not exist")


async def test_http_images_from_allowed_hosts_only(vl_client, tmp_path):
    import functools
    import http.server
    import threading

    (tmp_path / "cat.png").write_bytes(_png(10, (60, 60)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        app = _app(vl_client, allowed_media_domains=["127.0.0.1"])
        r = await _post(app, _chat(_image_part(f"{base}/cat.png")))
        assert r.status_code == 200, r.text
        assert_error(await _post(app, _chat(_image_part(f"{base}/missing.png"))), 400, "HTTP 404")
        other = _app(vl_client, allowed_media_domains=["example.com"])
        assert_error(await _post(other, _chat(_image_part(f"{base}/cat.png"))), 400, "not in --allowed-media-domains")
    finally:
        server.shutdown()


def test_bad_flag_values_name_the_flag():
    with pytest.raises(ValueError, match="--limit-mm-per-prompt: unknown modality 'audio'"):
        MultiModalOptions.from_flags(limit_mm_per_prompt={"audio": 1})
    with pytest.raises(ValueError, match="--limit-mm-per-prompt: image must be an integer"):
        MultiModalOptions.from_flags(limit_mm_per_prompt='{"image": -1}')
    with pytest.raises(ValueError, match="--mm-processor-kwargs: unknown key 'size'"):
        MultiModalOptions.from_flags(mm_processor_kwargs={"size": 3})
    with pytest.raises(ValueError, match="video_max_frames must be a positive int"):
        MultiModalOptions.from_flags(mm_processor_kwargs={"video_max_frames": 0})
    with pytest.raises(ValueError, match="is not a directory"):
        MultiModalOptions.from_flags(allowed_local_media_path="/no/such/dir")
    options = MultiModalOptions.from_flags('{"image": 3}', '{"image_max_pixels": 200704, "video_max_frames": 30}')
    assert options.limits == {"image": 3, "video": 100}
    assert options.processor_overrides == {"max_pixels": 200704} and options.video == {"video_max_frames": 30}


async def test_mm_processor_kwargs_set_the_pixel_budget(vl_client):
    app = _app(vl_client, mm_processor_kwargs={"image_max_pixels": 56 * 56})
    big = _data_url(_png(11, (224, 224)))
    r = await _post(app, _chat(_image_part(big), return_token_ids=True))
    small = await _post(_app(vl_client), _chat(_image_part(big), return_token_ids=True))
    assert r.status_code == small.status_code == 200
    budget = len(r.json()["choices"][0]["message"]["prompt_token_ids"])
    default = len(small.json()["choices"][0]["message"]["prompt_token_ids"])
    assert default - budget == 16 - 4  # 56x56 pixels: 4 image tokens instead of the default budget's 16


def test_enable_mm_on_a_text_model_is_refused(engine_client):
    with pytest.raises(ValueError, match="--enable-mm: the model .* has no vision tower"):
        build_app(engine_client, ServerArgs(enable_mm=True))


async def test_images_with_escape_special_tokens_are_refused_by_name(vl_client):
    app = build_app(vl_client, ServerArgs(served_model_names=("vl",), escape_special_tokens=True))
    r = await _post(app, _chat(_image_part(_data_url(_png(12, (56, 56))))))
    assert_error(r, 400, "messages[0].content[0]", "--escape-special-tokens")
    r = await _post(app, _chat({"type": "text", "text": "just text"}))
    assert r.status_code == 200, r.text


def test_the_server_writes_images_as_the_offline_llm_does():
    from fd_core.entrypoints.openai import mm_content
    from fd_core.multimodal import prompt

    assert mm_content.IMAGE_PROMPT == prompt.IMAGE_PROMPT
