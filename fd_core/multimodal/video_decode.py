"""Video bytes or files -> the sampled RGB frames and their timestamps, with PyAV (no torch).

``decode_video(source, sample)`` opens a container (encoded bytes or a path), reads the first video
stream's frame count and average frame rate, asks ``sample(total_frames, fps)`` which frame indices
to keep, and decodes the stream in order keeping those, as HF's ``read_video_pyav`` does (so the
frames are the ones HF's processor sees). A container that reports no frame count is counted by
decoding. Undecodable bytes, a container without a video stream, a video with no frames or more
than ``max_frames`` frames, or frames larger than ``max_pixels`` raise ``VideoError`` (a
ValueError) naming the problem. Called by ``video_processor`` in the API process / offline ``LLM``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DecodedVideo", "VideoError", "decode_video"]


class VideoError(ValueError):
    """A video that cannot be used: undecodable, no video stream, too long or too large."""


@dataclass
class DecodedVideo:
    frames: np.ndarray  # [T, H, W, 3] uint8, the sampled frames in order (transformed, if asked)
    indices: list[int]  # the sampled frame numbers (HF's metadata.frames_indices)
    fps: float  # the stream's average frame rate (timestamps are index / fps)
    total_frames: int


def _open(source: bytes | bytearray | Path | str) -> Any:
    try:
        import av
    except ImportError:  # pragma: no cover - av is in the 'video' extra
        raise VideoError("video input needs PyAV: pip install 'fd-core[video]'") from None
    what = f"video file {str(source)!r}" if isinstance(source, (str, Path)) else f"video bytes ({len(source)} bytes)"
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise VideoError(f"{what} does not exist")
    try:
        container = av.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source))
    except Exception as exc:  # av.error.InvalidDataError and friends
        raise VideoError(f"{what} cannot be decoded as a video: {exc}") from None
    if not container.streams.video:
        container.close()
        raise VideoError(f"{what} has no video stream")
    return container, what


def decode_video(source: bytes | bytearray | Path | str, sample: Callable[[int, float], Sequence[int]],
                 max_frames: int = 18000, max_pixels: int = 8192 * 8192,
                 transform: Callable[[np.ndarray, int, float], np.ndarray] | None = None) -> DecodedVideo:
    """The frames ``sample(total_frames, fps)`` picks from ``source`` (bytes or a path), each passed
    through ``transform(frame, index, fps)`` as it is decoded (so full-size frames are not all kept)."""
    container, what = _open(source)
    try:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > max_pixels:
            raise VideoError(f"{what}: frames of {width}x{height} pixels are too large: at most {max_pixels} pixels")
        fps = float(stream.average_rate) if stream.average_rate else 24.0
        total = int(stream.frames or 0)
        if total == 0:  # the container does not say: count by decoding, then read it again from the start
            total = sum(1 for _ in _frames(container, what, max_frames))
            container.close()
            container, what = _open(source)  # a raw stream cannot seek back; reopening works for any
        if total == 0:
            raise VideoError(f"{what} holds no frames")
        if total > max_frames:
            raise VideoError(f"{what} has {total} frames, more than the {max_frames} this server decodes "
                             "(--mm-processor-kwargs video_max_input_frames)")
        indices = [int(i) for i in sample(total, fps)]
        wanted, last = set(indices), indices[-1]
        frames = []
        for i, frame in enumerate(_frames(container, what, max_frames)):
            if i > last:
                break
            if i in wanted:
                rgb = frame.to_ndarray(format="rgb24")
                frames.append(transform(rgb, i, fps) if transform is not None else rgb)
        if not frames:
            raise VideoError(f"{what}: none of its frames could be decoded")
        return DecodedVideo(np.stack(frames), indices, fps, total)
    finally:
        container.close()


def _frames(container: Any, what: str, max_frames: int) -> Any:
    """The container's video frames in order; decoding errors become ``VideoError``."""
    try:
        for n, frame in enumerate(container.decode(video=0)):
            if n >= max_frames:
                raise VideoError(f"{what} has more than {max_frames} frames, the most this server decodes "
                                 "(--mm-processor-kwargs video_max_input_frames)")
            yield frame
    except VideoError:
        raise
    except Exception as exc:
        raise VideoError(f"{what} cannot be decoded: {type(exc).__name__}: {exc}") from None
