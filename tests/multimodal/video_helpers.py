"""Small generated videos (PyAV), and HF's video processor as the oracle, for the video tests.

HF's ``Ernie4_5_VLMoeVideoProcessor`` needs torchvision. PyPI's torchvision for our torch is a CUDA
build: installed into the venv, transformers believes it works and its image processors break. So
scripts/setup-venv installs it apart, ``pip install --no-deps --target $VENV/oracle/torchvision``,
and ``hf_video_oracle`` runs HF's processor in a subprocess (this file run as a script) with that
directory on its path; the test process never imports torchvision. The comparisons skip, naming
what is missing, without that directory or without a TrueType font (fonts-dejavu-core, installed
by scripts/system-deps) for the timestamps HF draws.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ORACLE_TIMEOUT_S = 600


def font_path() -> str | None:
    """A TrueType font on this machine (the timestamps HF draws need one), or None."""
    from fd_core.testing.vl_checkpoint import system_font

    font = system_font()
    return None if font is None else str(font)


def torchvision_dir() -> Path:
    """Where scripts/setup-venv installs torchvision for the oracle (outside site-packages)."""
    return Path(sys.prefix) / "oracle" / "torchvision"


def frames_array(frames: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 frames with moving structure (smooth enough to survive compression)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    big = np.kron(base, np.ones((8, 8, 1), np.uint8))[:height, :width]
    out = np.stack([np.roll(big, 3 * i, axis=1) for i in range(frames)])
    out[:, height // 4: height // 2, :, 0] = np.arange(frames, dtype=np.uint8)[:, None, None] * 30
    return out


def make_video(frames: int = 5, width: int = 96, height: int = 64, fps: int = 4, seed: int = 0,
               codec: str = "mpeg4", fmt: str = "mp4") -> bytes:
    """An encoded video of ``frames_array`` frames (PyAV)."""
    av = pytest.importorskip("av")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames_array(frames, width, height, seed):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def require_oracle() -> str:
    """The font path, or a skip naming what the HF comparison lacks."""
    pytest.importorskip("av")
    pytest.importorskip("transformers")
    if not torchvision_dir().is_dir():
        pytest.skip(f"torchvision for HF's video processor is not installed at {torchvision_dir()} "
                    "(scripts/setup-venv installs it there)")
    font = font_path()
    if font is None:
        pytest.skip("no TrueType font for the timestamps HF draws (scripts/system-deps installs fonts-dejavu-core)")
    return font


def oracle_job(video: str | Path | np.ndarray, video_fps: float | None = None,
               pretrained: str | Path | None = None, **kwargs: Any) -> dict[str, Any]:
    """One input for ``hf_video_oracle``: ``video`` (a file path, decoded with PyAV; or ``[T, H, W, 3]``
    frames at ``video_fps``) through ``Ernie4_5_VLMoeVideoProcessor(**kwargs)``, or through
    ``from_pretrained(pretrained, **kwargs)``."""
    return {"video": video, "video_fps": video_fps, "kwargs": kwargs,
            "pretrained": None if pretrained is None else str(pretrained)}


def hf_video_oracle(workdir: Path, jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """HF's video processor on each of ``jobs`` (``oracle_job``), all in one subprocess (importing
    torch and transformers is most of its time): per job ``pixel_values``, ``grid_thw`` (the one
    video's) and ``timestamps`` (the seconds it drew on the frames). Skips as ``require_oracle``."""
    require_oracle()
    requests = {}
    for name, job in jobs.items():
        request = {**job, "out": str(workdir / f"hf_{name}.npz")}
        if isinstance(job["video"], np.ndarray):
            np.save(workdir / f"hf_{name}.npy", job["video"])
            request.update(video=None, frames=str(workdir / f"hf_{name}.npy"))
        else:
            request["video"] = str(job["video"])
        requests[name] = request
    (workdir / "hf_requests.json").write_text(json.dumps(requests))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(torchvision_dir())] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    done = subprocess.run([sys.executable, __file__, str(workdir / "hf_requests.json")], env=env,
                          capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S)
    assert done.returncode == 0, f"HF's video processor failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    results = {}
    for name, request in requests.items():
        with np.load(request["out"]) as out:
            results[name] = {"pixel_values": out["pixel_values"], "grid_thw": [int(v) for v in out["grid_thw"]],
                             "timestamps": [float(v) for v in out["timestamps"]]}
    return results


def _load_torchvision() -> None:
    """Import torchvision from the oracle directory. That CUDA build's operator library does not
    load with torch's CPU build, and its import fails registering fake kernels for those operators;
    the transforms HF's video processor uses need none of them, so the registrations are skipped."""
    import types

    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [n for n in sys.modules if n.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401


def _oracle_main(requests_file: str) -> None:
    """The subprocess side of ``hf_video_oracle``: run HF's processor on each request, write each
    one's outputs to its .npz."""
    _load_torchvision()
    from transformers.models.ernie4_5_vl_moe.video_processing_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeVideoProcessor,
    )
    from transformers.video_utils import VideoMetadata, load_video

    def fetch(urls: list[Any], sample_indices_fn: Any = None) -> tuple[list, list]:
        out = [load_video(u, backend="pyav", sample_indices_fn=sample_indices_fn) for u in urls]
        return [o[0] for o in out], [o[1] for o in out]

    for request in json.loads(Path(requests_file).read_text()).values():
        if request["pretrained"]:
            processor = Ernie4_5_VLMoeVideoProcessor.from_pretrained(request["pretrained"], **request["kwargs"])
        else:
            processor = Ernie4_5_VLMoeVideoProcessor(**request["kwargs"])
        processor.fetch_videos = fetch  # HF's default decoder is torchcodec, not installed here
        drawn: list[float] = []
        convert = processor._convert_timestamp

        def record(seconds: float, drawn: list[float] = drawn, convert: Any = convert) -> str:
            drawn.append(float(seconds))
            return convert(seconds)

        processor._convert_timestamp = record
        if request.get("frames"):
            frames = np.load(request["frames"])
            metadata = VideoMetadata(total_num_frames=len(frames), fps=request["video_fps"])
            out = processor(videos=[frames], video_metadata=[metadata], return_tensors="pt")
        else:
            out = processor(videos=[request["video"]], return_tensors="pt")
        np.savez(request["out"], pixel_values=out["pixel_values_videos"].numpy(),
                 grid_thw=out["video_grid_thw"][0].numpy(), timestamps=np.array(drawn, dtype=np.float64))


if __name__ == "__main__":
    _oracle_main(sys.argv[1])
