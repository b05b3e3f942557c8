"""The offline LLM takes FastDeploy's limit_mm_per_prompt and mm_processor_kwargs (as the server's
flags): more images than the limit raise naming it; image_max_pixels sets the pixel budget."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

Image = pytest.importorskip("PIL.Image")
TWO = "Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> Picture 2:<|IMAGE_START|><|IMAGE_PLACEHOLDER|>" \
      "<|IMAGE_END|> compare"


def test_limit_and_pixel_budget(tmp_path):
    from fd_core import LLM, SamplingParams

    path = generate_vl_checkpoint(tmp_path / "vl", "tiny-vl", naming="paddle")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8))
    llm = LLM(model=str(path), backend="cpu", max_model_len=256, num_gpu_blocks_override=32, block_size=16,
              limit_mm_per_prompt={"image": 1}, mm_processor_kwargs={"image_max_pixels": 56 * 56})
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with pytest.raises(ValueError, match=r"2 images in one prompt; at most 1 .*limit_mm_per_prompt"):
        llm.generate({"prompt": TWO, "multi_modal_data": {"image": [image, image]}}, params, use_tqdm=False)
    (out,) = llm.generate({"prompt": "Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> what?",
                           "multi_modal_data": {"image": image}}, params, use_tqdm=False)
    image_id = llm.engine.core.model_config.image_token_id
    assert list(out.prompt_token_ids).count(image_id) == 4  # 56x56 pixels: 2x2 merged tokens
    with pytest.raises(ValueError, match="--limit-mm-per-prompt: unknown modality 'audio'"):
        LLM(model=str(path), backend="cpu", limit_mm_per_prompt={"audio": 1})
