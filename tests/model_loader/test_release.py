"""Loading releases each tensor's mapped pages once placed: a multi-GB shard never sits in RssFile whole.

(ERNIE-4.5-21B-A3B's nine 5.4 GB bf16 shards would otherwise add up to a
shard's size to the peak RSS of a quantize-on-load that keeps ~12 GB.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fd_core.model_loader import safetensors_io
from fd_core.model_loader.safetensors_io import SafetensorsFile


def _rss_file() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _write(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for a in tensors.values():
            f.write(a.astype("<f4").tobytes())


def test_release_drops_a_tensors_pages_and_a_reread_sees_the_same_values(tmp_path: Path) -> None:
    big = np.arange(16 << 20, dtype=np.float32)  # 64 MB
    small = np.full(1000, 3.0, dtype=np.float32)
    _write(tmp_path / "m.safetensors", {"big": big, "small": small})
    reader = SafetensorsFile(tmp_path / "m.safetensors")
    before = _rss_file()
    assert float(reader.get_raw("big")[::1024].sum()) == float(big[::1024].sum())  # touch every page
    touched = _rss_file()
    assert touched - before > 48 << 20
    reader.release("big")
    assert touched - _rss_file() > 48 << 20
    assert np.array_equal(reader.get_raw("big"), big) and np.array_equal(reader.get_raw("small"), small)
    reader.release("small")  # a tensor sharing a page with another: harmless
    assert np.array_equal(reader.get_raw("small"), small)
    reader.close()
    reader.release("big")  # nothing mapped: nothing to do


def test_the_loader_releases_every_tensor_of_a_quantized_moe_load(checkpoint_factory, monkeypatch) -> None:  # noqa: ANN001
    from fd_core.backends import get_backend
    from fd_core.model_loader import load_model
    from fd_core.quantization import parse_quantization

    model_dir = checkpoint_factory("tiny-moe", "pytorch", shards=3)
    released: list[str] = []
    original = safetensors_io.SafetensorsFile.release

    def spy(self: SafetensorsFile, name: str) -> None:
        released.append(name)
        original(self, name)

    monkeypatch.setattr(safetensors_io.SafetensorsFile, "release", spy)
    backend = get_backend("cpu")
    backend.set_device(0)
    quant = parse_quantization("wint4", "Ernie4_5_MoeForCausalLM")
    model = load_model(model_dir, backend.ops, quantization=quant)
    names = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(released) == sorted(names)  # each one, once
    assert model.parameters()
