"""The compare machinery on a tiny checkpoint: workload, HF baseline, fd-serve driver, table.

No timing assertions: only that both sides run the same requests to their
lengths, time what they should, and (same model, greedy, fp32) agree on text.
"""

from __future__ import annotations

import math

import pytest

from fd_core.benchmarks.compare import (
    ServerProcess,
    build_workload,
    compare_table,
    run_hf,
    run_server,
)
from fd_core.benchmarks.metrics import compute_metrics


def test_workload_is_seeded_and_in_range():
    a = build_workload(50, 4.0, vocab_size=1000, input_range=(5, 9), output_range=(2, 3), seed=3)
    b = build_workload(50, 4.0, vocab_size=1000, input_range=(5, 9), output_range=(2, 3), seed=3)
    assert a == b
    assert {len(p) for p in a.prompts} <= set(range(5, 10)) and set(a.output_lens) <= {2, 3}
    assert all(100 <= t < 1000 for p in a.prompts for t in p)
    assert a.arrivals[0] == 0.0 and all(x <= y for x, y in zip(a.arrivals, a.arrivals[1:]))
    assert 5.0 < a.arrivals[-1] < 25.0  # 49 Poisson gaps of mean 0.25 s
    assert build_workload(3, math.inf, vocab_size=1000).arrivals == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("kwargs, match", [
    ({"num": 0}, "num-prompts"),
    ({"request_rate": 0.0}, "request-rate"),
    ({"input_range": (9, 5)}, "input-len"),
    ({"vocab_size": 50}, "vocab_size"),
])
def test_workload_rejects_bad_values(kwargs, match):
    args = {"num": 2, "request_rate": 1.0, "vocab_size": 1000, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_workload(**args)


def test_hf_and_server_run_the_same_requests(checkpoint_factory, tmp_path):
    pytest.importorskip("transformers")
    model = checkpoint_factory("tiny-dense", "pytorch")
    # the 3rd and 4th arrive together, long after the rest: two HF batches at least
    workload = build_workload(4, math.inf, vocab_size=2048, input_range=(4, 12), output_range=(2, 6), seed=1)
    workload.arrivals = [0.0, 0.0, 0.3, 0.3]
    from fd_core.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(model)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    hf, hf_duration, batches = run_hf(model, workload, decode=decode, log=lambda _: None)
    assert sum(b["size"] for b in batches) == 4 and len(batches) >= 2
    assert batches[0]["new_tokens"] == max(workload.output_lens[: batches[0]["size"]])
    for rec, n_out, arrival in zip(hf, workload.output_lens, workload.arrivals):
        assert rec.success and rec.output_len == n_out and len(rec.itl) == n_out - 1
        assert 0 < rec.ttft <= rec.latency and rec.start_time == arrival
    with ServerProcess(model, ["--backend", "cpu", "--max-model-len", "64", "--num-gpu-blocks-override", "16",
                               "--block-size", "16"], tmp_path / "serve.log") as server:
        fd, fd_duration = run_server(server.url, str(model), workload)
    assert server.proc is not None and server.proc.returncode == 0
    for rec, n_out, prompt in zip(fd, workload.output_lens, workload.prompts):
        assert rec.success, rec.error
        assert rec.output_len == n_out and rec.prompt_len == len(prompt)  # ignore_eos, token-id prompts
    assert [r.generated_text for r in fd] == [r.generated_text for r in hf]  # one model, greedy

    table, ratios = compare_table(compute_metrics(hf, hf_duration), compute_metrics(fd, fd_duration))
    assert "fd-core / HF" in table and "Median TTFT (ms)" in table
    assert ratios["completed"] == 1.0
    assert ratios["output_throughput"] == pytest.approx(hf_duration / fd_duration)
