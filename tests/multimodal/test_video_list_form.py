"""``multi_modal_data={"video": [frame, frame, ...]}`` (the documented "list of frames"
form) is one video, not a list of videos: it gives what the stacked ``[T, H, W, 3]`` array
gives; a list of arrays each 4-D stays a list of videos."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.multimodal.prompt import _frame_list

pytest.importorskip("av")


def test_frames_make_one_video_and_videos_stay_videos():
    frame = np.zeros((8, 8, 3), np.uint8)
    assert _frame_list([frame, frame]) and not _frame_list([np.stack([frame, frame])] * 2)
    assert not _frame_list([]) and not _frame_list("clip.mp4") and not _frame_list(["a.mp4", "b.mp4"])


def test_a_list_of_frames_answers_as_the_stacked_array(tmp_path):
    from fd_core import LLM, SamplingParams
    from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

    model = generate_vl_checkpoint(tmp_path / "vl", "tiny-vl", naming="paddle")
    llm = LLM(str(model), backend="cpu", max_model_len=512, num_gpu_blocks_override=64, block_size=16)
    frames = [np.random.default_rng(i).integers(0, 256, (56, 84, 3), dtype=np.uint8) for i in range(4)]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    prompt = "Video 1:<|VIDEO_START|><|VIDEO_END|> what happens?"
    listed, stacked = (llm.generate({"prompt": prompt, "multi_modal_data": {"video": v}}, params, use_tqdm=False)[0]
                       for v in (frames, np.stack(frames)))
    assert listed.prompt_token_ids == stacked.prompt_token_ids
    assert listed.outputs[0].token_ids == stacked.outputs[0].token_ids
