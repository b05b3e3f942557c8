"""ERNIE-4.5-VL time to first token: one 448x448 image vs the same text alone, encoder cache hit vs miss.

On a generated VL checkpoint (``--shape bench-vl``: the released vision tower's width, 1280 with 16
heads and an MLP of 5120, at 4 of its 32 layers; a small MoE language model; random weights; or
``tiny-vl``), through the offline ``LLM`` with prefix caching off (so only the encoder cache can
save work), one request at a time, ``max_tokens=1``:

- ``text``: the prompt with the image's ``Picture 1:`` marker text but no image;
- ``image miss``: the prompt with a new 448x448 image each time (256 image tokens): image
  processing (in the caller), the vision encoder, and the longer prefill;
- ``image hit``: the same image again: the encoder's features come from the encoder cache;
- ``processor``: the image processor alone (decode, resize, normalize, patch) on the PNG bytes.

The cases alternate ``--repeats`` times; medians and the ratios are printed with the CPU model
and the load average. ``--backend cpu x86`` measures each backend in turn (one engine at a time).
``--baseline`` adds, in the same engine, ``baseline miss``: the same new-image request with the
vision tower and resampler on the CPU reference's ops (every linear a plain fp32 ``paddle.matmul``,
the attention ``fd_core.ops.vision_attention``'s reference: what the tower ran before it went
through the backend's ops), and the encoder alone (``model.encode``) both ways.

    python benchmarks/vl_ttft.py                     # bench-vl, 5 repeats, cpu
    python benchmarks/vl_ttft.py --backend cpu x86 --baseline
    python benchmarks/vl_ttft.py --shape tiny-vl --repeats 3

Timings on a shared machine are noisy; read the ratios of one run.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from fd_core.testing.vl_checkpoint import generate_vl_checkpoint  # noqa: E402

TEXT = "User: Picture 1:{image} What is in this picture? Describe the objects, their colours and the scene.\n" \
       "Assistant: "
IMAGE = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"


def checkpoint(shape: str) -> Path:
    path = ROOT / "checkpoints" / f"{shape}-paddle"
    if not (path / "model.safetensors").is_file():
        print(f"generating {path} (once)", flush=True)
        generate_vl_checkpoint(path, shape, naming="paddle")
    return path


def png(seed: int, size: int = 448) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    # smooth colour fields, not noise: PNG size and decode time like a photo's, not a worst case
    base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(base).resize((size, size), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def timed(llm, prompt, params) -> float:
    start = time.perf_counter()
    llm.generate(prompt, params, use_tqdm=False)
    return time.perf_counter() - start


def set_tower_ops(model, ops) -> None:
    """Point the vision tower's and the resampler's layers at ``ops`` (the language model keeps its own)."""
    seen: set[int] = set()

    def visit(obj) -> None:
        if id(obj) in seen or not hasattr(obj, "__dict__"):
            return
        seen.add(id(obj))
        if hasattr(obj, "ops"):
            obj.ops = ops
        for value in vars(obj).values():
            for item in value if isinstance(value, list) else [value]:
                if type(item).__module__.startswith("fd_core.models."):
                    visit(item)

    visit(model.vision)
    visit(model.resampler)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(backend: str, args) -> None:
    from fd_core import LLM, SamplingParams
    from fd_core._paddle import import_paddle
    from fd_core.backends.base import Ops
    from fd_core.multimodal import ImageProcessor
    from fd_core.plugins.manager import make_plugin_manager

    paddle = import_paddle()
    model = checkpoint(args.shape)
    llm = LLM(model=str(model), backend=backend, max_model_len=2048, enable_prefix_caching=False,
              dtype="float32")
    params = SamplingParams(max_tokens=1, temperature=0.0)
    processor = ImageProcessor.from_dir(model)
    text_prompt = TEXT.format(image="")
    image_prompt = TEXT.format(image=IMAGE)
    n_text = len(llm.tokenizer.encode(text_prompt))
    hit_image = png(0)
    processed = processor(hit_image)
    runner = llm.engine.core.runner
    net = runner.model
    own_ops = net.vision.blocks[0].ops
    import fd_core.backends.cpu as reference_module

    reference_ops = Ops(make_plugin_manager(reference_module), "cpu")
    print(f"\n=== CPU: {cpu_model()}; backend {backend}; checkpoint {args.shape} ({model}); {load()}")
    print(f"image 448x448 -> grid {processed.grid_thw}, {processed.num_tokens} LM tokens; text prompt {n_text} tokens")
    print(f"vision attention answered by {own_ops.implementers('vision_attention')[0]}")
    timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": hit_image}}, params)  # warm-up, fills the cache
    timed(llm, text_prompt, params)
    cache = runner.encoder_cache
    times: dict[str, list[float]] = {"text": [], "image miss": [], "image hit": [], "processor": []}
    if args.baseline:
        times.update({"baseline miss": [], "encoder": [], "baseline encoder": [], "attention": [],
                      "baseline attention": []})
        block = net.vision.blocks[0]
        n_patches = int(np.prod(processed.grid_thw))
        rng = np.random.default_rng(0)
        attn_args = [paddle.to_tensor(rng.normal(0, 1, (n_patches, 3 * block.num_heads * block.head_dim)).astype(
            np.float32))] + [paddle.to_tensor(f(rng.uniform(0, 6, (n_patches, block.head_dim // 2))).astype(
                np.float32)) for f in (np.cos, np.sin)]

    def attention(ops) -> float:  # one vision block's attention op, one image's patches
        start = time.perf_counter()
        ops.vision_attention(*attn_args, [0, n_patches], block.num_heads, block.head_dim**-0.5)
        return time.perf_counter() - start

    def encoder(ops) -> float:
        set_tower_ops(net, ops)
        start = time.perf_counter()
        net.encode(processed.pixel_values, processed.grid_thw)
        elapsed = time.perf_counter() - start
        set_tower_ops(net, own_ops)
        return elapsed

    def miss(seed: int) -> float:
        misses = cache.misses
        elapsed = timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": png(seed)}}, params)
        assert cache.misses == misses + 1, "a new image must miss the encoder cache"
        return elapsed

    for r in range(args.repeats):
        times["text"].append(timed(llm, text_prompt, params))
        times["image miss"].append(miss(r + 1))
        hits = cache.hits
        times["image hit"].append(timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": hit_image}},
                                        params))
        assert cache.hits == hits + 1, "the same image must hit the encoder cache"
        data = png(r + 100)
        start = time.perf_counter()
        processor(data)
        times["processor"].append(time.perf_counter() - start)
        if args.baseline:
            set_tower_ops(net, reference_ops)
            times["baseline miss"].append(miss(r + 1000))
            set_tower_ops(net, own_ops)
            times["encoder"].append(encoder(own_ops))
            times["baseline encoder"].append(encoder(reference_ops))
            times["attention"].append(attention(own_ops))
            times["baseline attention"].append(attention(reference_ops))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian of {args.repeats} (seconds, max_tokens=1, one request at a time, prefix caching off); {load()}")
    for name, value in med.items():
        print(f"  {name:<16} {value * 1000:9.1f} ms   (all: {', '.join(f'{t * 1000:.0f}' for t in times[name])})")
    if args.baseline:
        print(f"\nimage miss, tower on {backend}'s ops vs the reference's: {med['baseline miss'] / med['image miss']:.2f}x "
              f"faster; encoder alone {med['baseline encoder'] / med['encoder']:.2f}x; one block's attention op "
              f"{med['baseline attention'] / med['attention']:.2f}x")
    print(f"\nTTFT image (encoder miss) / text alone: {med['image miss'] / med['text']:.2f}x")
    print(f"TTFT image (encoder hit)  / text alone: {med['image hit'] / med['text']:.2f}x")
    print(f"encoder cache: miss / hit TTFT {med['image miss'] / med['image hit']:.2f}x "
          f"(the encoder's share of a miss: {(med['image miss'] - med['image hit']) / med['image miss']:.0%})")
    print(f"image processor alone: {med['processor'] * 1000:.1f} ms "
          f"({med['processor'] / med['image miss']:.0%} of a miss)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="bench-vl", choices=["bench-vl", "tiny-vl"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", nargs="+", default=["cpu"], help="backends to measure, one after the other")
    ap.add_argument("--baseline", action="store_true",
                    help="also time misses and the encoder with the tower on the CPU reference's ops")
    args = ap.parse_args()
    for backend in args.backend:
        run(backend, args)
        gc.collect()


if __name__ == "__main__":
    main()
