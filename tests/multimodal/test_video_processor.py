"""ERNIE-4.5-VL's video processor against HF's: the same sampled frames, timestamps, resize,
pixel values, grids and token counts; torchvision's antialiased bicubic reproduced integer for
integer; bad videos raise VideoError naming the problem."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from fd_core.multimodal.video_processor import (
    VideoError,
    VideoProcessor,
    VideoProcessorConfig,
    sample_indices,
)
from fd_core.multimodal.video_resize import resize_bicubic_aa
from tests.multimodal.video_helpers import (
    frames_array,
    hf_video_oracle,
    make_video,
    oracle_job,
    require_oracle,
)

pytest.importorskip("av")

BUDGET = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}
HF_SIZE = {"shortest_edge": BUDGET["min_pixels"], "longest_edge": BUDGET["max_pixels"]}


@pytest.mark.parametrize("seed", range(6))
def test_resize_is_torch_uint8_antialiased_bicubic(seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    h, w = (int(v) for v in rng.integers(8, 200, 2))
    nh, nw = (int(v) for v in rng.integers(4, 260, 2))
    if seed == 0:
        nh = h  # one axis unchanged: that pass is skipped
    frames = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    want = torch.nn.functional.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous(), size=(nh, nw),
                                           mode="bicubic", antialias=True, align_corners=False)
    np.testing.assert_array_equal(resize_bicubic_aa(frames, nh, nw), want.permute(0, 2, 3, 1).numpy())


def test_frame_sampling_is_hf_float32_arange():
    torch = pytest.importorskip("torch")
    for total in range(1, 200, 3):
        for fps in (None, 0.5, 2.0, 3.3):
            for lo, hi in ((1, 180), (16, 180), (4, 9)):
                config = VideoProcessorConfig(min_frames=lo, max_frames=hi, fps=fps)
                num = min(max(total / 30.0 * fps if fps else total, lo), hi, total)
                want = torch.arange(0, total, total / num).int().tolist()
                assert sample_indices(total, 30.0, config) == want, (total, fps, lo, hi)


# video files through HF's processor: name -> (frames, options)
HF_CLIPS = {
    "odd": (5, {"min_frames": 2}),  # odd: the last frame repeats
    "max_frames": (6, {"min_frames": 1, "max_frames": 3}),
    "fps": (8, {"min_frames": 1, "fps": 2.0}),
}
ARRAY = {"frames": 7, "width": 70, "height": 50, "seed": 3, "fps": 2.0}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """Every HF comparison's inputs and HF's outputs, from one oracle subprocess."""
    font = require_oracle()
    from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

    work = tmp_path_factory.mktemp("hf_video")
    jobs = {}
    for name, (frames, options) in HF_CLIPS.items():
        (work / f"{name}.mp4").write_bytes(make_video(frames=frames, width=96, height=64, fps=4, seed=frames))
        jobs[name] = oracle_job(work / f"{name}.mp4", size=HF_SIZE, font=font, **options)
    array = frames_array(ARRAY["frames"], ARRAY["width"], ARRAY["height"], seed=ARRAY["seed"])
    jobs["array"] = oracle_job(array, video_fps=ARRAY["fps"], size=HF_SIZE, font=font, min_frames=1)
    model = generate_vl_checkpoint(work / "tiny-vl", "tiny-vl")
    (work / "tiny_vl.mp4").write_bytes(make_video(frames=5, width=96, height=64, fps=4, seed=9))
    jobs["tiny_vl"] = oracle_job(work / "tiny_vl.mp4", pretrained=model)
    return {"font": font, "work": work, "model": model, "array": array, "out": hf_video_oracle(work, jobs)}


def _assert_same(ours, want):
    assert list(ours.grid_thw) == want["grid_thw"]
    np.testing.assert_array_equal(ours.pixel_values, want["pixel_values"])
    assert ours.timestamps == want["timestamps"]


@pytest.mark.parametrize("name", HF_CLIPS)
def test_matches_hf_video_processor(hf, name):
    options = HF_CLIPS[name][1]
    ours = VideoProcessor(VideoProcessorConfig(font=hf["font"], **BUDGET, **options))(
        (hf["work"] / f"{name}.mp4").read_bytes())
    _assert_same(ours, hf["out"][name])
    assert ours.num_tokens == math.prod(ours.grid_thw) // (2 * 2 * 2)


def test_frames_given_as_an_array_match_hf(hf):
    ours = VideoProcessor(VideoProcessorConfig(font=hf["font"], min_frames=1, **BUDGET))(hf["array"], fps=ARRAY["fps"])
    _assert_same(ours, hf["out"]["array"])
    assert ours.timestamps == [i / 2.0 for i in range(7)]


def test_tiny_vl_video_config_reads_the_same_in_hf(hf):
    """tiny-vl's video_preprocessor_config.json (and the font copied next to it) loads in HF's
    ``from_pretrained`` and gives the same pixels as ``VideoProcessor.from_dir``."""
    ours = VideoProcessor.from_dir(hf["model"])((hf["work"] / "tiny_vl.mp4").read_bytes())
    assert ours.grid_thw == (6, 4, 6)  # 5 frames (+1 repeated), 56x84 within 4..16 merged patches
    _assert_same(ours, hf["out"]["tiny_vl"])
    assert sys.modules.get("torchvision") is None  # HF's side ran in a subprocess


def test_config_from_dir_and_options(tmp_path):
    (tmp_path / "video_preprocessor_config.json").write_text(
        '{"size": {"shortest_edge": 3136, "longest_edge": 12544}, "min_frames": 4, "font": "Missing.ttf"}')
    config = VideoProcessorConfig.from_dir(tmp_path, video_max_frames=8, video_fps=2)
    assert (config.min_pixels, config.max_pixels, config.min_frames, config.max_frames, config.fps) == \
        (3136, 12544, 4, 8, 2)
    assert config.font is None  # not shipped: PIL's built-in font stands in
    with pytest.raises(ValueError, match="video_min_frames 4 exceeds video_max_frames 2"):
        VideoProcessorConfig.from_dir(tmp_path, video_max_frames=2)
    with pytest.raises(ValueError, match="unknown video processor option 'frames'"):
        VideoProcessorConfig.from_dir(tmp_path, frames=3)


def test_without_the_font_frames_are_still_stamped():
    processor = VideoProcessor(VideoProcessorConfig(font=None, min_frames=1, **BUDGET))
    stamped = processor(frames_array(2, 96, 64))
    plain = VideoProcessor(VideoProcessorConfig(font=None, min_frames=1, draw_on_frames=False, **BUDGET))(
        frames_array(2, 96, 64))
    assert stamped.grid_thw == plain.grid_thw == (2, 4, 6)
    assert not np.array_equal(stamped.pixel_values, plain.pixel_values)


@pytest.mark.parametrize("make, words", [
    (lambda p: b"not a video at all" * 10, ["video bytes (180 bytes)", "cannot be decoded"]),
    (lambda p: make_video(frames=2)[:300], ["video bytes (300 bytes)"]),
    (lambda p: p / "missing.mp4", ["missing.mp4", "does not exist"]),
    (lambda p: make_video(frames=6), ["6 frames", "more than the 4", "video_max_input_frames"]),
    (lambda p: np.zeros((2, 8, 8), np.uint8), ["[T, H, W, 3] uint8"]),
    (lambda p: frames_array(2, 8, 8), ["too small"]),
])
def test_bad_videos_name_the_problem(tmp_path, make, words):
    processor = VideoProcessor(VideoProcessorConfig(min_frames=1, max_input_frames=4, **BUDGET))
    with pytest.raises(VideoError) as info:
        processor(make(tmp_path))
    for word in words:
        assert word in str(info.value)


def test_an_audio_only_container_has_no_video_stream():
    av = pytest.importorskip("av")
    import io

    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with pytest.raises(VideoError, match="has no video stream"):
        VideoProcessor()(buf.getvalue())


def test_the_api_process_decodes_video_without_torch_or_paddle(tmp_path):
    import subprocess
    import sys

    (tmp_path / "clip.mp4").write_bytes(make_video(frames=3))
    code = ("import sys; from fd_core.multimodal.video_processor import VideoProcessor, VideoProcessorConfig; "
            f"v = VideoProcessor(VideoProcessorConfig(min_frames=1, min_pixels=3136, max_pixels=12544))({str(tmp_path / 'clip.mp4')!r}); "
            "print(v.grid_thw, 'torch' in sys.modules, 'paddle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "(4, 4, 6) False False", out.stdout + out.stderr


def test_a_raw_stream_without_a_frame_count_is_read_twice_by_reopening():
    """A raw H.264 elementary stream has no frame count and cannot seek back: the frames are
    counted by decoding, and the stream is opened again (it used to be a 500 from av's seek)."""
    av = pytest.importorskip("av")
    import io

    from fd_core.multimodal.video_decode import decode_video
    from tests.multimodal.video_helpers import frames_array

    buf = io.BytesIO()
    with av.open(buf, "w", format="h264") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "h264", rate=4)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for frame in frames_array(6, 96, 64):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    video = decode_video(buf.getvalue(), lambda total, fps: list(range(total)))
    assert video.frames.shape == (6, 64, 96, 3)
