"""The image processor equals HF's ERNIE-4.5-VL PIL processor (pixel values, grids, token counts);
the prompt's 3D positions equal HF's get_rope_index; bad images are refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest

from fd_core.multimodal import ImageError, ImageProcessor, build_inputs
from fd_core.multimodal.encoder_cache import EncoderCache
from fd_core.multimodal.image_processor import ImageProcessorConfig

Image = pytest.importorskip("PIL.Image")

SIZES = [(64, 40), (56, 56), (90, 30), (300, 200), (17, 23)]
BUDGET = {"min_pixels": 28 * 28, "max_pixels": 28 * 28 * 16}


def _image(seed: int, size: tuple[int, int], mode: str = "RGB"):
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    return image.convert(mode)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
@pytest.mark.parametrize("size", SIZES)
def test_matches_hf(size, mode):
    transformers = pytest.importorskip("transformers")
    hf = transformers.Ernie4_5_VLMoeImageProcessorPil(size={"shortest_edge": BUDGET["min_pixels"],
                                                           "longest_edge": BUDGET["max_pixels"]})
    image = _image(sum(size), size, mode)
    want = hf(images=[image], return_tensors="np")
    got = ImageProcessor(ImageProcessorConfig(**BUDGET))(image)
    assert got.grid_thw == tuple(int(x) for x in want["image_grid_thw"][0])
    assert got.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])
    assert got.num_tokens == hf.get_number_of_image_patches(size[1], size[0], dict(BUDGET)) // 4


def test_rope_index_matches_hf(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fd_core.models.config import load_config
    from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

    path = generate_vl_checkpoint(tmp_path, "tiny-vl")
    config = load_config(path)
    processor = ImageProcessor.from_dir(path)
    images = [processor(_image(1, (64, 40))), processor(_image(2, (90, 30)))]
    s, e, p = config.image_start_token_id, config.image_end_token_id, config.image_token_id
    ids, mm = build_inputs([500, 501, s, p, e, 502, s, p, e, 503, 504], images, config)
    assert len(ids) == 11 - 2 + sum(im.num_tokens for im in images)
    model = transformers.Ernie4_5_VLMoeModel(transformers.AutoConfig.from_pretrained(path))
    want, delta = model.get_rope_index(torch.tensor([ids]), torch.tensor([[int(t == p) for t in ids]]),
                                       image_grid_thw=torch.tensor([im.grid_thw for im in images]))
    np.testing.assert_array_equal(mm.positions3d, want[:, 0].numpy().T)
    assert mm.rope_delta == int(delta[0, 0])
    assert mm.placeholder_ranges == [(3, images[0].num_tokens), (6 + images[0].num_tokens, images[1].num_tokens)]
    assert mm.vision_mask.sum() == sum(im.num_tokens for im in images) + 4
    np.testing.assert_array_equal(mm.positions(len(ids), len(ids) + 2),
                                  np.repeat(np.arange(len(ids), len(ids) + 2)[:, None] + mm.rope_delta, 3, 1))


def test_hash_is_content():
    proc = ImageProcessor(ImageProcessorConfig(**BUDGET))
    assert proc(_image(1, (64, 40))).hash == proc(np.asarray(_image(1, (64, 40)))).hash
    assert proc(_image(1, (64, 40))).hash != proc(_image(2, (64, 40))).hash


def test_bad_images():
    proc = ImageProcessor(ImageProcessorConfig(**BUDGET, max_input_pixels=100 * 100))
    with pytest.raises(ImageError, match="too large"):
        proc(_image(0, (200, 100)))
    with pytest.raises(ImageError, match="cannot be decoded"):
        proc(b"GIF89a-not-an-image")
    buf = io.BytesIO()
    _image(0, (50, 50)).save(buf, format="PNG")
    with pytest.raises(ImageError, match="cannot be decoded"):
        proc(buf.getvalue()[:60])  # truncated
    with pytest.raises(ImageError, match="does not exist"):
        proc("/nonexistent/cat.png")
    with pytest.raises(ImageError, match=r"\[H, W, 3\] uint8"):
        proc(np.zeros((4, 4), np.float32))
    with pytest.raises(ImageError, match="aspect ratio"):
        ImageProcessor()(_image(0, (2100, 10)))
    with pytest.raises(ValueError, match="unknown image processor option"):
        ImageProcessorConfig.from_dir("/nonexistent", max_pixel=3)


def test_encoder_cache_lru():
    class Feat:
        def __init__(self, n):
            self.shape = (n, 4)

    cache = EncoderCache(capacity_tokens=10)
    calls = []
    for key in ["a", "b", "a", "c", "a", "b"]:
        cache.get(key, lambda key=key: calls.append(key) or Feat(4))
    assert calls == ["a", "b", "c", "b"]  # c evicts b (the least recently used)
    assert (cache.hits, cache.misses) == (2, 4)
