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

The cases alternate ``--repeats`` times; medians and the ratios are printed with the CPU model.

    python benchmarks/vl_ttft.py                     # bench-vl, 5 repeats
    python benchmarks/vl_ttft.py --shape tiny-vl --repeats 3

Timings on a shared machine are noisy; read the ratios of one run.
"""

from __future__ import annotations

import argparse
import io
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="bench-vl", choices=["bench-vl", "tiny-vl"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()

    from fd_core import LLM, SamplingParams
    from fd_core.multimodal import ImageProcessor

    model = checkpoint(args.shape)
    llm = LLM(model=str(model), backend=args.backend, max_model_len=2048, enable_prefix_caching=False,
              dtype="float32")
    params = SamplingParams(max_tokens=1, temperature=0.0)
    processor = ImageProcessor.from_dir(model)
    text_prompt = TEXT.format(image="")
    image_prompt = TEXT.format(image=IMAGE)
    n_text = len(llm.tokenizer.encode(text_prompt))
    hit_image = png(0)
    processed = processor(hit_image)
    print(f"CPU: {cpu_model()}; backend {args.backend}; checkpoint {args.shape} ({model})")
    print(f"image 448x448 -> grid {processed.grid_thw}, {processed.num_tokens} LM tokens; text prompt {n_text} tokens")
    timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": hit_image}}, params)  # warm-up, fills the cache
    timed(llm, text_prompt, params)
    cache = llm.engine.core.runner.encoder_cache
    times: dict[str, list[float]] = {"text": [], "image miss": [], "image hit": [], "processor": []}
    for r in range(args.repeats):
        times["text"].append(timed(llm, text_prompt, params))
        misses = cache.misses
        times["image miss"].append(timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": png(r + 1)}},
                                         params))
        assert cache.misses == misses + 1, "a new image must miss the encoder cache"
        hits = cache.hits
        times["image hit"].append(timed(llm, {"prompt": image_prompt, "multi_modal_data": {"image": hit_image}},
                                        params))
        assert cache.hits == hits + 1, "the same image must hit the encoder cache"
        data = png(r + 100)
        start = time.perf_counter()
        processor(data)
        times["processor"].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian of {args.repeats} (seconds, max_tokens=1, one request at a time, prefix caching off)")
    for name, value in med.items():
        print(f"  {name:<11} {value * 1000:9.1f} ms   (all: {', '.join(f'{t * 1000:.0f}' for t in times[name])})")
    print(f"\nTTFT image (encoder miss) / text alone: {med['image miss'] / med['text']:.2f}x")
    print(f"TTFT image (encoder hit)  / text alone: {med['image hit'] / med['text']:.2f}x")
    print(f"encoder cache: miss / hit TTFT {med['image miss'] / med['image hit']:.2f}x "
          f"(the encoder's share of a miss: {(med['image miss'] - med['image hit']) / med['image miss']:.0%})")
    print(f"image processor alone: {med['processor'] * 1000:.1f} ms "
          f"({med['processor'] / med['image miss']:.0%} of a miss)")


if __name__ == "__main__":
    main()
