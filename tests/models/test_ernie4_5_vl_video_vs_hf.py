"""ERNIE-4.5-VL with video prompts against HF transformers on the generated ``tiny-vl`` checkpoint:
through ``LLM`` (a video alone, a video beside an image, a chunked prefill cutting the video,
``LLM.chat`` with a ``video_url`` part) greedy tokens equal HF ``generate``'s and logprobs are within
1e-3; our 3D positions for a video equal HF's ``get_rope_index``."""

from __future__ import annotations

import base64

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from fd_core.models.config import load_config  # noqa: E402
from fd_core.multimodal import ImageProcessor, build_inputs  # noqa: E402
from fd_core.multimodal.video_processor import VideoProcessor  # noqa: E402
from fd_core.testing.vl_checkpoint import generate_vl_checkpoint  # noqa: E402
from tests.multimodal.video_helpers import make_video  # noqa: E402

NEW_TOKENS = 6
ATOL = 1e-3
VIDEO_OPTIONS = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 16, "video_min_frames": 1}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return generate_vl_checkpoint(tmp_path_factory.mktemp("vl_video"), "tiny-vl", naming="pytorch")


@pytest.fixture(scope="module")
def hf_model(vl_dir):
    return transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.float32).eval()


def hf_greedy(model, config, ids: list[int], images: list, videos: list, new_tokens: int = NEW_TOKENS):
    """HF ``generate``'s greedy tokens and their logprobs for expanded ``ids`` and processed media."""
    kwargs = {}
    if images:
        kwargs["pixel_values"] = torch.tensor(np.concatenate([im.pixel_values for im in images]))
        kwargs["image_grid_thw"] = torch.tensor([im.grid_thw for im in images])
    if videos:
        kwargs["pixel_values_videos"] = torch.tensor(np.concatenate([v.pixel_values for v in videos]))
        kwargs["video_grid_thw"] = torch.tensor([v.grid_thw for v in videos])
    image_ids = (config.image_token_id, config.image_start_token_id, config.image_end_token_id)
    video_ids = (config.video_token_id, config.video_start_token_id, config.video_end_token_id)
    mm = [1 if t == config.image_token_id else 2 if t == config.video_token_id else 0 for t in ids]
    moe = [1 if t in image_ids else 2 if t in video_ids else 0 for t in ids]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                             pad_token_id=0, mm_token_type_ids=torch.tensor([mm]),
                             moe_mm_token_type_ids=torch.tensor([moe]), **kwargs)
    new = out.sequences[0, len(ids):].tolist()
    return new, [float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, new)]


def _image(seed: int, size: tuple[int, int]):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _llm(vl_dir, **kwargs):
    from fd_core import LLM

    return LLM(model=str(vl_dir), backend="cpu", max_model_len=384, num_gpu_blocks_override=64, block_size=16,
               dtype="float32", mm_processor_kwargs=VIDEO_OPTIONS, **kwargs)


def _check(out, want, want_lp, name=""):
    got = out.outputs[0]
    assert list(got.token_ids) == want, name
    np.testing.assert_allclose([e[t].logprob for e, t in zip(got.logprobs, got.token_ids)], want_lp, atol=ATOL,
                               rtol=0, err_msg=name)


def test_video_prompts_match_hf(vl_dir, hf_model):
    from fd_core import SamplingParams

    config = load_config(vl_dir)
    videos = VideoProcessor.from_dir(vl_dir, **VIDEO_OPTIONS)
    images = ImageProcessor.from_dir(vl_dir)
    llm = _llm(vl_dir)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    clip, other = make_video(frames=5, seed=1), make_video(frames=6, width=64, height=96, seed=2)
    picture = _image(3, (56, 84))
    cases = {
        "one_video": ("User: Video 1:<|VIDEO_START|><|VIDEO_END|> what happens?", [], [clip]),
        "image_and_video": ("Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> then Video 1:"
                            "<|VIDEO_START|><|VIDEO_END|> and Video 2:<|VIDEO_START|><|VIDEO_END|> compare",
                            [picture], [clip, other]),
    }
    prompts, wants = [], []
    for text, pics, clips in cases.values():
        processed_images, processed_videos = [images(p) for p in pics], [videos(c) for c in clips]
        ids, mm = build_inputs(llm.tokenizer.encode(text), processed_images, config, processed_videos)
        assert ids.count(config.video_token_id) == sum(v.num_tokens for v in processed_videos)
        wants.append(hf_greedy(hf_model, config, ids, processed_images, processed_videos))
        data = {"video": clips, **({"image": pics} if pics else {})}
        prompts.append({"prompt": text, "multi_modal_data": data})
    outs = llm.generate(prompts, params, use_tqdm=False)
    for name, out, (want, want_lp) in zip(cases, outs, wants):
        _check(out, want, want_lp, name)


def test_chunked_prefill_cutting_a_video(vl_dir, hf_model):
    from fd_core import SamplingParams

    config = load_config(vl_dir)
    llm = _llm(vl_dir, max_num_batched_tokens=7, enable_chunked_prefill=True, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    text = "First a question, then Video 1:<|VIDEO_START|><|VIDEO_END|> answer:"
    clip = make_video(frames=4, seed=7)
    processed = VideoProcessor.from_dir(vl_dir, **VIDEO_OPTIONS)(clip)
    ids, _ = build_inputs(llm.tokenizer.encode(text), [], config, [processed])
    want, want_lp = hf_greedy(hf_model, config, ids, [], [processed])
    for _ in range(2):  # the second time: prefix-cache blocks and the encoder cache are reused
        (out,) = llm.generate({"prompt": text, "multi_modal_data": {"video": clip}}, params, use_tqdm=False)
        _check(out, want, want_lp)
    cache = llm.engine.core.runner.encoder_cache
    assert cache.misses == 1


def test_chat_with_a_video_url_part(vl_dir, hf_model, tmp_path):
    from fd_core import SamplingParams

    config = load_config(vl_dir)
    clip = make_video(frames=3, seed=4)
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    llm = _llm(vl_dir)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    outs = [llm.chat([{"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]}], params,
                     use_tqdm=False)[0]
            for part in ({"type": "video_url", "video_url": {"url": url}},
                         {"type": "video_url", "video_url": str(path)}, {"type": "video", "video": clip})]
    assert "Video 1:<|VIDEO_START|><|VIDEO_END|>" in outs[0].prompt
    ids = llm.tokenizer.encode(outs[0].prompt)
    processed = VideoProcessor.from_dir(vl_dir, **VIDEO_OPTIONS)(clip)
    expanded, _ = build_inputs(ids, [], config, [processed])
    want, want_lp = hf_greedy(hf_model, config, expanded, [], [processed])
    for out in outs:
        _check(out, want, want_lp)


def test_video_positions_are_hf_rope_index(vl_dir, hf_model):
    config = load_config(vl_dir)
    processed = VideoProcessor.from_dir(vl_dir, **VIDEO_OPTIONS)(make_video(frames=8, seed=5))
    picture = ImageProcessor.from_dir(vl_dir)(_image(1, (84, 56)))
    text_ids = [5, 6, config.video_start_token_id, config.video_end_token_id, 7,
                config.image_start_token_id, config.image_token_id, config.image_end_token_id, 8, 9]
    ids, mm = build_inputs(text_ids, [picture], config, [processed])
    mm_types = [1 if t == config.image_token_id else 2 if t == config.video_token_id else 0 for t in ids]
    positions, delta = hf_model.model.get_rope_index(
        torch.tensor([ids]), torch.tensor([mm_types]), image_grid_thw=torch.tensor([picture.grid_thw]),
        video_grid_thw=torch.tensor([processed.grid_thw]))
    np.testing.assert_array_equal(mm.positions3d, positions[:, 0].T.numpy())
    assert mm.rope_delta == int(delta[0, 0])
    assert [type(item).__name__ for item in mm.images] == ["ProcessedVideo", "ProcessedImage"]


def test_video_limits_and_bad_videos(vl_dir):
    from fd_core import LLM

    llm = LLM(model=str(vl_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=32, block_size=16,
              dtype="float32", limit_mm_per_prompt={"video": 1}, mm_processor_kwargs=VIDEO_OPTIONS)
    two = "<|VIDEO_START|><|VIDEO_END|><|VIDEO_START|><|VIDEO_END|>"
    with pytest.raises(ValueError, match="2 videos in one prompt; at most 1"):
        llm.generate({"prompt": two, "multi_modal_data": {"video": [make_video(2), make_video(2)]}}, use_tqdm=False)
    with pytest.raises(ValueError, match="cannot be decoded"):
        llm.generate({"prompt": "<|VIDEO_START|><|VIDEO_END|>", "multi_modal_data": {"video": b"junk" * 20}},
                     use_tqdm=False)
    with pytest.raises(ValueError, match="holds 0 video placeholder"):
        llm.generate({"prompt": "no slot here", "multi_modal_data": {"video": make_video(2)}}, use_tqdm=False)
