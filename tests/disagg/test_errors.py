"""A transfer that cannot be done fails its request with a clear error, never
a hang, and other requests keep running."""

from __future__ import annotations

import pytest

from fd_core import LLM, SamplingParams, envs
from tests.disagg.instances import ENGINE, free_port, prefill_instance

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
PROMPT = list(range(100, 140))


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


def _decode(model_dir, ports: str, **overrides) -> LLM:
    args = dict(ENGINE)
    args.update(overrides)
    return LLM(str(model_dir), splitwise_role="decode", innode_prefill_ports=ports, **args)


def _failed(out) -> str:
    sample = out.outputs[0]
    assert sample.finish_reason == "abort" and not sample.token_ids
    assert out.error_code == 502 and out.error_msg == str(sample.stop_reason)  # FastDeploy's error fields
    return str(sample.stop_reason)


def test_a_different_layer_count_fails_the_request_naming_it(dense, checkpoint_factory):
    deeper = checkpoint_factory("tiny-dense", "pytorch", num_hidden_layers=3)
    with prefill_instance(deeper) as (_, address):
        out = _decode(dense, address).generate([PROMPT], GREEDY, use_tqdm=False)[0]
    message = _failed(out)
    assert "num_layers differs" in message and "2" in message and "3" in message


def test_a_different_kv_dtype_fails_the_request_naming_both(dense):
    with prefill_instance(dense, kv_cache_dtype="bfloat16") as (_, address):
        out = _decode(dense, address).generate([PROMPT], GREEDY, use_tqdm=False)[0]
    message = _failed(out)
    assert "kv_dtype differs" in message and "'float32'" in message and "'bfloat16'" in message


def test_a_dead_prefill_instance_fails_its_request_and_others_finish(dense, monkeypatch):
    monkeypatch.setenv("FD_PD_TRANSFER_TIMEOUT", "1")
    envs.reset()
    try:
        with prefill_instance(dense) as (_, address):
            dead = f"127.0.0.1:{free_port()}"
            llm = _decode(dense, f"{address},{dead}")
            outs = llm.generate([PROMPT, PROMPT[:20]], GREEDY, use_tqdm=False)
    finally:
        monkeypatch.delenv("FD_PD_TRANSFER_TIMEOUT")
        envs.reset()
    finished = [o for o in outs if o.outputs[0].finish_reason == "length"]
    failed = [o for o in outs if o.outputs[0].finish_reason == "abort"]
    assert len(finished) == 1 and len(failed) == 1
    assert f"prefill instance {dead} did not answer within 1 s" in _failed(failed[0])
