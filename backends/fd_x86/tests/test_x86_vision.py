"""fd_x86's vision-tower attention (fd_x86.vision, csrc/kernels_vision_avx512.cc)
against fd-core's reference, its declines, and ERNIE-4.5-VL on the x86 backend
against HF transformers (greedy tokens equal, logprobs within 1e-3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build, vision

paddle = pytest.importorskip("paddle")

from fd_core.ops.vision_attention import reference_vision_attention  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    if not vision.available():
        pytest.skip("the vision attention kernel needs AVX-512 F/BW/VL/DQ")
    build.load_ops()  # builds once per key (~30-60 s), then cached in ~/.cache/fd_x86


def _inputs(lengths: list[int], heads: int, dh: int, seed: int = 0) -> tuple[Any, Any, Any, list[int]]:
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    angles = rng.uniform(0, 2 * np.pi, (n, dh // 2)).astype(np.float32)
    qkv = rng.normal(0, 1, (n, 3 * heads * dh)).astype(np.float32)
    cu = [0, *np.cumsum(lengths).tolist()]
    return paddle.to_tensor(qkv), paddle.to_tensor(np.cos(angles)), paddle.to_tensor(np.sin(angles)), cu


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lengths,heads,dh", [
    ([256], 16, 80),          # the released tower's heads, a 16x16 grid
    ([7], 1, 16),             # fewer rows than a register tile
    ([64, 64, 64], 4, 64),    # video frames
    ([5, 0, 70, 131], 3, 40), # ragged frames, one empty; Dh not a multiple of 16
    ([33], 2, 2),             # the smallest head
    ([50], 2, 136),           # Dh over 6 vectors: two value tiles
])
def test_kernel_matches_the_reference(lengths: list[int], heads: int, dh: int, threads: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "num_threads", lambda: threads)
    qkv, cos, sin, cu = _inputs(lengths, heads, dh)
    got = vision.vision_attention(qkv, cos, sin, cu, heads, dh**-0.5)
    assert got is not None and got.shape == [sum(lengths), heads * dh]
    want = reference_vision_attention(qkv, cos, sin, cu, heads, dh**-0.5)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=2e-6)


def test_strided_inputs_are_copied_not_misread() -> None:
    qkv, cos, sin, cu = _inputs([40], 2, 16, seed=1)
    wide = paddle.concat([cos, sin], axis=-1)
    cos_view, sin_view = wide[:, :8], wide[:, 8:]  # non-contiguous views
    got = vision.vision_attention(qkv, cos_view, sin_view, cu, 2, 0.25)
    np.testing.assert_allclose(got.numpy(), reference_vision_attention(qkv, cos, sin, cu, 2, 0.25).numpy(),
                               rtol=1e-5, atol=2e-6)


def test_declines_what_it_has_no_kernel_for(monkeypatch: pytest.MonkeyPatch) -> None:
    qkv, cos, sin, cu = _inputs([10], 2, 8)
    assert vision.vision_attention(qkv.astype("bfloat16"), cos, sin, cu, 2, 0.5) is None  # 16-bit qkv
    odd, cos3, sin3, _ = _inputs([10], 2, 6)
    assert vision.vision_attention(odd, cos3, sin3, cu, 4, 0.5) is None  # 2*6*3 / (3*4) = 3: an odd head size
    assert vision.vision_attention(qkv, cos[:, :2], sin[:, :2], cu, 2, 0.5) is None  # cos of the wrong width
    monkeypatch.setattr(vision, "_AVAILABLE", [False])  # FD_X86_VISION_ATTN=0
    assert vision.vision_attention(qkv, cos, sin, cu, 2, 0.5) is None
    # the hook then falls through to the reference through Ops
    from fd_core.backends import get_backend

    ops = get_backend("x86").ops
    assert ops.implementers("vision_attention") == ["fd_x86.backend", "fd_core.backends.cpu"]
    got = ops.vision_attention(qkv, cos, sin, cu, 2, 0.5)
    np.testing.assert_array_equal(got.numpy(), reference_vision_attention(qkv, cos, sin, cu, 2, 0.5).numpy())


def test_bad_cu_seqlens_is_an_error_naming_it() -> None:
    qkv, cos, sin, _ = _inputs([10], 2, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens \[0, 4\] must rise from 0 to the 10 rows"):
        vision.vision_attention(qkv, cos, sin, [0, 4], 2, 0.5)


def test_vl_model_on_x86_matches_hf(tmp_path_factory: pytest.TempPathFactory,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny-vl on --backend x86: the vision blocks' attention runs the native kernel and the
    greedy tokens and logprobs are HF's (as tests/models/test_ernie4_5_vl_vs_hf.py on cpu)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("PIL.Image")
    import torch

    from fd_core import LLM, SamplingParams
    from fd_core.models.config import load_config
    from fd_core.multimodal import ImageProcessor, build_inputs
    from fd_core.testing.vl_checkpoint import generate_vl_checkpoint
    from tests.models.test_ernie4_5_vl_vs_hf import ATOL, CASES, NEW_TOKENS, _hf_greedy, _image

    answered = []
    native = vision.vision_attention

    def spy(*args: Any) -> Any:
        out = native(*args)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(vision, "vision_attention", spy)
    path = generate_vl_checkpoint(tmp_path_factory.mktemp("vl_x86"), "tiny-vl", naming="pytorch")
    hf = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    config, processor = load_config(path), ImageProcessor.from_dir(path)
    llm = LLM(model=str(path), backend="x86", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
              dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    for name in ("one_image", "two_images"):
        text, specs = CASES[name]
        images = [_image(seed, size) for seed, size in specs]
        ids, _ = build_inputs(llm.tokenizer.encode(text), [processor(im) for im in images], config)
        want, want_lp = _hf_greedy(hf, config, ids, [processor(im) for im in images])
        got = llm.generate({"prompt": text, "multi_modal_data": {"image": images}}, params, use_tqdm=False)[0]
        out = got.outputs[0]
        assert list(out.token_ids) == want, name
        lps = [entry[t].logprob for entry, t in zip(out.logprobs, out.token_ids)]
        np.testing.assert_allclose(lps, want_lp, atol=ATOL, rtol=0, err_msg=name)
    assert answered and all(answered)  # every vision block's attention ran natively
