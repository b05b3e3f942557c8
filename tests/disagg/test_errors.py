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


def _decode_engine(model_dir, address: str):
    from fd_core.config import EngineArgs
    from fd_core.disagg.config import DisaggConfig
    from fd_core.disagg.decode import DecodeEngine
    from fd_core.engine.core import EngineCore

    core = EngineCore(EngineArgs.from_kwargs(str(model_dir), **ENGINE))
    return DecodeEngine(core, DisaggConfig("decode", prefill_addrs=(address,), timeout_s=5.0))


def _drain(engine, limit_s: float = 30.0) -> list:
    import time

    outputs, deadline = [], time.monotonic() + limit_s
    while engine.has_unfinished_requests():
        assert time.monotonic() < deadline, "the decode engine never finished"
        outputs.extend(engine.step())
    return outputs


def test_a_request_id_reused_after_an_abort_gets_its_own_transfer(dense):
    """Abort a request while its prompt is away, resend it under the same id: the stale
    reply is dropped (it used to write freed blocks and then crash on the second reply)."""
    from fd_core.engine.request import EngineCoreRequest

    with prefill_instance(dense) as (_, address):
        engine = _decode_engine(dense, address)
        try:
            engine.add_request(EngineCoreRequest("X", PROMPT, GREEDY))
            engine.abort(["X"])
            engine.add_request(EngineCoreRequest("X", PROMPT, GREEDY))
            tokens = [t for o in _drain(engine) if o.request_id == "X" for t in o.new_token_ids]
        finally:
            engine.close()
    want = LLM(str(dense), **ENGINE).generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert tokens == list(want)


def test_an_idle_engine_takes_a_landed_aborted_transfer_off_its_queue(dense):
    """After an aborted request's reply lands there is nothing to run, but the engine still
    has that transfer to take: it reports unfinished work until a step takes it (the engine
    loop's wake pipe is drained there; it used to stay readable and spin the loop)."""
    import time

    from fd_core.engine.request import EngineCoreRequest

    with prefill_instance(dense) as (_, address):
        engine = _decode_engine(dense, address)
        try:
            engine.add_request(EngineCoreRequest("Y", PROMPT, GREEDY))
            engine.abort(["Y"])
            deadline = time.monotonic() + 30
            while engine._done.empty():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert engine.has_unfinished_requests()
            assert _drain(engine) == [] and not engine.has_unfinished_requests()
        finally:
            engine.close()


def test_a_malformed_task_is_answered_with_an_error_and_the_prefill_engine_lives(dense):
    from fd_core.disagg.wire import PrefillReply, PrefillTask, dumps, loads

    with prefill_instance(dense) as (engine, _):
        replies: list = []
        broken = PrefillTask.__new__(PrefillTask)  # no fields at all
        engine._start([dumps(broken)], replies.append, 0.0)
        engine._start([b"\x80\x04not a pickle"], replies.append, 0.0)
        errors = [loads(r[0], PrefillReply).error for r in replies]
        assert len(errors) == 2 and all("prefill instance refused the task" in e for e in errors), errors
