"""FastDeploy's ERNIE-4.5-VL launch lines against the generated ``tiny-vl`` checkpoint through
fd-serve (the engine in its own process: the processed images travel to it pickled): the XPU
VL-28B line (TP 1, wint8, --enable-mm, --limit-mm-per-prompt, --mm-processor-kwargs) serves
image requests and answers 400s past the limit; the 424B line (wint4, --max-num-batched-tokens 384)
serves as written, --tensor-parallel-size 8 included, a tiny-vl with 8 attention heads (eight ranks on
the CPU), and exits 2 naming the size where the model's 4 heads do not divide over 8 ranks."""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from tests.entrypoints.test_fastdeploy_launch_lines import LINES, _serve, _words

Image = pytest.importorskip("PIL.Image")


def _line(page: str) -> str:
    return next(x[1] for x in LINES if x[0] == page)


def _png_url(seed: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(n_images: int) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": _png_url(i)}} for i in range(n_images)]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "what is it?"}]}],
            "max_tokens": 4, "temperature": 0}


@pytest.mark.slow
@pytest.mark.parametrize("page", ["XPU VL-28B", "ERNIE-4.5-VL-424B-A47B-Paddle"])
def test_vl_line_serves_images(page, checkpoint_factory, tmp_path):
    """Both lines as they are: the 424B one (wint4, --max-num-batched-tokens 384: chunks cut the
    prompt, an image's tokens included, into several steps; --tensor-parallel-size 8) on a tiny-vl
    whose 8 heads split over its 8 ranks (and whose vision experts keep an even width per rank for wint4)."""
    heads = {} if page == "XPU VL-28B" else {"num_attention_heads": 8, "head_dim": 8, "moe_intermediate_size": (32, 48)}
    model = checkpoint_factory("tiny-vl", "paddle", max_position_embeddings=131072, **heads)
    words = _words(_line(page), str(model))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    words[words.index("--port") + 1] = str(port)
    if "--metrics-port" in words:
        i = words.index("--metrics-port")
        words = words[:i] + words[i + 2:]
    log = tmp_path / "serve.log"
    env = {**os.environ, "FD_CPU_KVCACHE_SPACE": "0.25", "FD_LOG_DIR": str(tmp_path / "log")}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--host",
                                 "127.0.0.1", "--backend", "cpu", *words], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for _ in range(600):
                assert proc.poll() is None, log.read_text()
                try:
                    r = httpx.post(url, json=_chat(1), timeout=60)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            assert r.status_code == 200, (r.text, log.read_text())
            assert r.json()["usage"]["prompt_tokens"] > 4  # the image's tokens are in the prompt
            limit = 10 if page == "XPU VL-28B" else 100  # --limit-mm-per-prompt '{"image": 10 | 100, ...}'
            r = httpx.post(url, json=_chat(limit + 1), timeout=60)
            assert r.status_code == 400 and f"messages[0].content[{limit}]" in r.text, r.text
            r = httpx.post(url, json=_chat(2), timeout=60)  # the engine still serves
            assert r.status_code == 200, r.text
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
def test_424b_line_is_refused_where_the_heads_do_not_split(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-vl", "paddle", max_position_embeddings=131072)
    code, log, _ = _serve(_words(_line("ERNIE-4.5-VL-424B-A47B-Paddle"), str(model)), tmp_path)
    assert code == 2, log
    assert "--tensor-parallel-size 8 does not divide the model's num_attention_heads (4)" in log, log
