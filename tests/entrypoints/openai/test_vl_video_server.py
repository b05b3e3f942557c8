"""Video content parts behind the OpenAI server (the generated ``tiny-vl`` checkpoint): a
``video_url`` data: URL gives HF transformers' greedy tokens and logprobs; local files and http(s)
URLs follow the image flags; --limit-mm-per-prompt's video count, undecodable bytes, a container
without a video stream and a video with too many frames are 400s naming the part, and the engine
keeps serving after each."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.entrypoints.openai.helpers import assert_error
from tests.entrypoints.openai.test_vl_server import _app, _chat, _post
from tests.multimodal.video_helpers import make_video

pytest.importorskip("av")
pytestmark = pytest.mark.anyio
NEW_TOKENS = 6
VIDEO_OPTIONS = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 16, "video_min_frames": 1}


def _video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def _data_url(data: bytes) -> str:
    return f"data:video/mp4;base64,{base64.b64encode(data).decode()}"


def _video_app(client, **flags):
    return _app(client, mm_processor_kwargs=VIDEO_OPTIONS, **flags)


async def test_video_data_url_matches_hf(vl_client, vl_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fd_core.models.config import load_config
    from fd_core.multimodal.video_processor import VideoProcessor
    from tests.models.test_ernie4_5_vl_video_vs_hf import hf_greedy

    clip = make_video(frames=5, seed=11)
    r = await _post(_video_app(vl_client), _chat(_video_part(_data_url(clip)), {"type": "text", "text": "what moves?"},
                                                 logprobs=True, return_token_ids=True))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    config = load_config(vl_dir)
    processed = VideoProcessor.from_dir(vl_dir, **VIDEO_OPTIONS)(clip)
    prompt = message["prompt_token_ids"]
    assert prompt.count(config.video_token_id) == processed.num_tokens
    hf = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.float32).eval()
    want, want_lp = hf_greedy(hf, config, prompt, [], [processed], NEW_TOKENS)
    assert message["completion_token_ids"] == want
    got_lp = [entry["logprob"] for entry in r.json()["choices"][0]["logprobs"]["content"]]
    np.testing.assert_allclose(got_lp, want_lp, atol=1e-3, rtol=0)


async def test_limit_mm_per_prompt_counts_videos(vl_client):
    url = _data_url(make_video(frames=2))
    app = _video_app(vl_client, limit_mm_per_prompt={"video": 1})
    r = await _post(app, _chat(_video_part(url), {"type": "text", "text": "x"}, _video_part(url)))
    error = assert_error(r, 400, "messages[0].content[2]", "video 2", "--limit-mm-per-prompt", '"video": 1')
    assert error["param"] == "messages[0].content[2]"


def _audio_only() -> bytes:
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("part, words", [
    (_video_part(_data_url(b"not a video" * 20)), ["cannot be decoded"]),
    (_video_part(_data_url(make_video(frames=3)[:200])), ["video bytes (200 bytes)"]),
    (_video_part(_data_url(_audio_only())), ["no video stream"]),
    (_video_part(_data_url(make_video(frames=12))), ["12 frames", "video_max_input_frames"]),
    (_video_part("file:///etc/hostname"), ["local video files", "--allowed-local-media-path"]),
    (_video_part("https://example.com/clip.mp4"), ["video URL", "--allowed-media-domains"]),
    ({"type": "video_url", "video_url": {}}, ["needs its video as a URL string"]),
])
async def test_bad_videos_are_400s_and_the_engine_keeps_serving(vl_client, part, words):
    app = _app(vl_client, mm_processor_kwargs={**VIDEO_OPTIONS, "video_max_input_frames": 10})
    r = await _post(app, _chat({"type": "text", "text": "look"}, part))
    error = assert_error(r, 400, "messages[0].content[1]", *words)
    assert error["param"] == "messages[0].content[1]"
    r = await _post(app, _chat(_video_part(_data_url(make_video(frames=2))), {"type": "text", "text": "ok"}))
    assert r.status_code == 200, r.text


async def test_local_video_files_and_fastdeploy_forms(vl_client, tmp_path):
    clip = make_video(frames=3, seed=12)
    (tmp_path / "clip.mp4").write_bytes(clip)
    app = _video_app(vl_client, allowed_local_media_path=str(tmp_path))
    bodies = [_chat(_video_part(f"file://{tmp_path}/clip.mp4"), return_token_ids=True),
              _chat({"type": "video_url", "video_url": _data_url(clip)}, return_token_ids=True),
              _chat({"type": "video", "video": _data_url(clip)}, return_token_ids=True),
              _chat({"type": "video_url", "video_url": {"url": _data_url(clip), "uuid": "abc"}},
                    return_token_ids=True)]
    answers = []
    for body in bodies:
        r = await _post(app, body)
        assert r.status_code == 200, r.text
        answers.append(r.json()["choices"][0]["message"]["completion_token_ids"])
    assert all(a == answers[0] for a in answers)


def test_the_server_writes_videos_as_the_offline_llm_does():
    from fd_core.entrypoints.openai import mm_content
    from fd_core.multimodal import prompt

    assert mm_content.VIDEO_PROMPT == prompt.VIDEO_PROMPT


def test_video_processor_kwargs_are_checked_at_start():
    from fd_core.multimodal.options import MultiModalOptions

    with pytest.raises(ValueError, match="video_min_frames 10 exceeds video_max_frames 2"):
        MultiModalOptions.from_flags(mm_processor_kwargs={"video_min_frames": 10, "video_max_frames": 2})
    with pytest.raises(ValueError, match="video_fps must be a positive float"):
        MultiModalOptions.from_flags(mm_processor_kwargs={"video_fps": -1})
    options = MultiModalOptions.from_flags(mm_processor_kwargs={"video_fps": 2, "video_max_input_frames": 600})
    assert options.video == {"video_fps": 2.0, "video_max_input_frames": 600}
