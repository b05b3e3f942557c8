"""ERNIE-4.5-VL against HF transformers' Ernie4_5_VLMoeForConditionalGeneration on the generated
``tiny-vl`` checkpoint: through ``LLM``, text only, one image and two images give HF's greedy tokens
with logprobs within 1e-3 (both checkpoint namings; chunked prefill cutting an image; the prefix
cache keyed by image hashes; the encoder run once per image)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from fd_core.models.config import load_config  # noqa: E402
from fd_core.multimodal import ImageProcessor, build_inputs  # noqa: E402
from fd_core.testing.vl_checkpoint import generate_vl_checkpoint  # noqa: E402

NEW_TOKENS = 8
ATOL = 1e-3


def _image(seed: int, size: tuple[int, int]) -> object:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return generate_vl_checkpoint(tmp_path_factory.mktemp("vl_pt"), "tiny-vl", naming="pytorch")


@pytest.fixture(scope="module")
def hf_model(vl_dir):
    model = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.float32)
    return model.eval()


def _prompt_ids(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text)


def _hf_greedy(model, config, ids: list[int], images: list) -> tuple[list[int], list[float]]:
    kwargs = {}
    if images:
        pixel = np.concatenate([im.pixel_values for im in images])
        kwargs = dict(
            pixel_values=torch.tensor(pixel), image_grid_thw=torch.tensor([im.grid_thw for im in images]),
            mm_token_type_ids=torch.tensor([[int(t == config.image_token_id) for t in ids]]),
            moe_mm_token_type_ids=torch.tensor([[int(t in (config.image_token_id, config.image_start_token_id,
                                                            config.image_end_token_id)) for t in ids]]),
        )
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             eos_token_id=None, pad_token_id=0, **kwargs)
    new = out.sequences[0, len(ids):].tolist()
    return new, [float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, new)]


CASES = {
    "text": ("Describe the weather today.", []),
    "one_image": ("User: Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> what is it?", [(1, (64, 40))]),
    "two_images": ("Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> and Picture 2:<|IMAGE_START|>"
                   "<|IMAGE_PLACEHOLDER|><|IMAGE_END|> compare them", [(2, (56, 56)), (3, (90, 30))]),
}


@pytest.mark.parametrize("naming", ["pytorch", "paddle"])
def test_llm_matches_hf(naming, vl_dir, hf_model, tmp_path_factory):
    from fd_core import LLM, SamplingParams

    path = vl_dir if naming == "pytorch" else generate_vl_checkpoint(
        tmp_path_factory.mktemp("vl_pd"), "tiny-vl", naming="paddle")
    config = load_config(path)
    processor = ImageProcessor.from_dir(path)
    llm = LLM(model=str(path), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
              dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    prompts, wants = [], []
    for text, specs in CASES.values():
        images = [_image(seed, size) for seed, size in specs]
        ids, _ = build_inputs(_prompt_ids(llm, text), [processor(im) for im in images], config)
        wants.append(_hf_greedy(hf_model, config, ids, [processor(im) for im in images]))
        prompts.append({"prompt": text, "multi_modal_data": {"image": images}} if images else text)
    outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = set()
    for name, out, (want, want_lp) in zip(CASES, outs, wants):
        got = out.outputs[0]
        assert list(got.token_ids) == want, name
        lps = [entry[t].logprob for entry, t in zip(got.logprobs, got.token_ids)]
        np.testing.assert_allclose(lps, want_lp, atol=ATOL, rtol=0, err_msg=name)
        tokens.update(want)
    assert len(tokens) > 6  # a model stuck on one token would make this weak


def test_chunked_prefill_and_prefix_cache(vl_dir, hf_model):
    """Prefill chunks of 7 tokens cut through the image; a second request with the same image
    reuses cached blocks and encoder features; a different image with the same ids does not."""
    from fd_core import LLM, SamplingParams

    config = load_config(vl_dir)
    processor = ImageProcessor.from_dir(vl_dir)
    llm = LLM(model=str(vl_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
              dtype="float32", max_num_batched_tokens=7, enable_chunked_prefill=True, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    text = "A long question first, then Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> answer:"
    results = []
    for seed in (5, 5, 6):
        image = _image(seed, (84, 56))
        ids, _ = build_inputs(llm.tokenizer.encode(text), [processor(image)], config)
        want, want_lp = _hf_greedy(hf_model, config, ids, [processor(image)])
        (out,) = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, params, use_tqdm=False)
        got = out.outputs[0]
        assert list(got.token_ids) == want
        np.testing.assert_allclose([e[t].logprob for e, t in zip(got.logprobs, got.token_ids)], want_lp,
                                   atol=ATOL, rtol=0)
        results.append(out)
    assert results[1].num_cached_tokens > results[0].num_cached_tokens  # the same image: blocks reused
    assert results[2].num_cached_tokens <= 16  # another image: only blocks before it
    cache = llm.engine.core.runner.encoder_cache
    assert (cache.misses, len(cache)) == (2, 2)  # each distinct image encoded once across all chunks


def test_chat_with_image_parts(vl_dir, tmp_path):
    from fd_core import LLM, SamplingParams

    path = tmp_path / "cat.png"
    _image(9, (60, 60)).save(path)
    llm = LLM(model=str(vl_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
              dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    by_path = llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(path)}},
                                                      {"type": "text", "text": "What is this?"}]}], params,
                       use_tqdm=False)
    by_pil = llm.chat([{"role": "user", "content": [{"type": "image", "image": Image.open(path)},
                                                     {"type": "text", "text": "What is this?"}]}], params,
                      use_tqdm=False)
    assert list(by_path[0].outputs[0].token_ids) == list(by_pil[0].outputs[0].token_ids)
    assert "<|IMAGE_START|>" in by_path[0].prompt


def test_bad_images_are_refused(vl_dir, tmp_path):
    from fd_core import LLM

    llm = LLM(model=str(vl_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
              dtype="float32")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG not really")
    text = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> hi"
    with pytest.raises(ValueError, match="cannot be decoded"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": str(bad)}}, use_tqdm=False)
    with pytest.raises(ValueError, match="2 image\\(s\\) were given"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": [_image(1, (30, 30))] * 2}}, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
