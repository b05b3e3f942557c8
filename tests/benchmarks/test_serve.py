"""fd-bench serve end to end against a fake streaming server on a real socket."""

from __future__ import annotations

import json
import socket

import pytest

from fd_core.benchmarks.cli import main

from .fake_server import ServerThread, make_app


def _run(tmp_path, url: str, *argv: str) -> dict:
    code = main(["serve", "--base-url", url, "--disable-tqdm", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "r.json", *argv])
    assert code == 0
    return json.loads((tmp_path / "r.json").read_text())


def test_completions_records_failures_tokens_and_chunks(tmp_path, capsys):
    app = make_app(fail_every=3)
    with ServerThread(app) as server:
        result = _run(tmp_path, server.url, "--num-prompts", "6", "--random-input-len", "8",
                      "--random-output-len", "6", "--random-range-ratio", "0.5", "--ignore-eos",
                      "--max-concurrency", "2", "--api-key", "sekret", "--goodput", "ttft:60000")
    assert "Serving Benchmark Result" in capsys.readouterr().out
    s, reqs = result["summary"], result["requests"]
    assert (s["completed"], s["failed"]) == (4, 2)
    assert result["model_id"] == "fake-model"
    assert sum(not ok for ok in reqs["success"]) == 2
    assert all("HTTP 500" in e for ok, e in zip(reqs["success"], reqs["errors"]) if not ok)
    bodies = app.state.bodies
    assert len(bodies) == 6
    assert all(b["model"] == "fake-model" and b["ignore_eos"] is True and b["stream"] is True
               and b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
               for b in bodies)
    assert all(h["authorization"] == "Bearer sekret" for h in app.state.headers)
    assert sorted(b["max_tokens"] for b in bodies) == sorted(reqs["max_tokens"])
    done = 0
    for i, ok in enumerate(reqs["success"]):
        if not ok:
            assert reqs["output_lens"][i] == 0
            continue
        done += 1
        n_out = reqs["output_lens"][i]
        assert n_out == reqs["max_tokens"][i] and 3 <= n_out <= 9
        assert sum(reqs["chunk_tokens"][i]) == n_out  # 1, 2, 2, ... from continuous usage
        assert reqs["chunk_tokens"][i][0] == 1
        assert len(reqs["itls"][i]) == len(reqs["chunk_tokens"][i]) - 1
        assert 0 < reqs["ttfts"][i] <= reqs["e2els"][i]
        assert reqs["tpots"][i] == pytest.approx((reqs["e2els"][i] - reqs["ttfts"][i]) / (n_out - 1))
        assert reqs["generated_texts"][i] == " tok" * n_out
    assert s["total_output_tokens"] == sum(reqs["output_lens"])
    assert s["total_input_tokens"] == sum(n for ok, n in zip(reqs["success"], reqs["input_lens"]) if ok)
    assert s["request_goodput"] == pytest.approx(done / s["duration"])
    assert result["config"]["request_rate"] == "inf"


def test_without_usage_counts_chunks(tmp_path):
    with ServerThread(make_app(send_usage=False)) as server:
        result = _run(tmp_path, server.url, "--num-prompts", "3", "--random-input-len", "4",
                      "--random-output-len", "5", "--model", "mine", "--request-rate", "1000",
                      "--burstiness", "0.5")
    reqs = result["requests"]
    assert all(reqs["success"])
    # 5 tokens arrive as chunks of 1, 2, 2: without usage each chunk counts one token
    assert reqs["output_lens"] == [3, 3, 3]
    assert reqs["input_lens"] == [4, 4, 4]  # the dataset's own count
    assert reqs["start_times"] == sorted(reqs["start_times"])


def test_chat_endpoint_with_text_prompts(tmp_path, checkpoint_factory):
    app = make_app()
    with ServerThread(app) as server:
        result = _run(tmp_path, server.url, "--endpoint", "/v1/chat/completions", "--num-prompts", "2",
                      "--tokenizer", str(checkpoint_factory("tiny-dense")), "--random-input-len", "16",
                      "--random-output-len", "4", "--dataset-name", "shared-prefix",
                      "--shared-prefix-len", "8")
    assert result["summary"]["completed"] == 2
    assert result["requests"]["output_lens"] == [4, 4]
    assert all(isinstance(b["messages"][0]["content"], str) for b in app.state.bodies)


def test_chat_without_tokenizer_and_unreachable_server_fail_clearly(capsys):
    assert main(["serve", "--endpoint", "/v1/chat/completions", "--num-prompts", "1"]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--port", str(port), "--num-prompts", "1", "--disable-tqdm"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_warmups_are_sent_but_not_measured(tmp_path, capsys):
    app = make_app()
    with ServerThread(app) as server:
        result = _run(tmp_path, server.url, "--num-prompts", "2", "--random-input-len", "4",
                      "--random-output-len", "2", "--num-warmups", "1", "--extra-body", '{"top_k": 5}')
    assert len(app.state.bodies) == 3 and result["summary"]["completed"] == 2
    assert all(b["top_k"] == 5 for b in app.state.bodies)
    with ServerThread(make_app(fail_every=1)) as server:
        assert main(["serve", "--base-url", server.url, "--num-prompts", "1", "--num-warmups", "1"]) == 2
    assert "warm-up request" in capsys.readouterr().err


def test_arrival_times_are_seeded_and_start_at_zero():
    from fd_core.benchmarks.serve import arrival_times

    a = arrival_times(40, request_rate=4.0, seed=3)
    assert a == arrival_times(40, request_rate=4.0, seed=3) != arrival_times(40, request_rate=4.0, seed=4)
    assert a[0] == 0.0 and a == sorted(a) and 3.0 < a[-1] < 25.0  # 39 gaps of mean 0.25 s
    assert arrival_times(3) == [0.0, 0.0, 0.0]
    assert arrival_times(1, request_rate=2.0) == [0.0]


def test_usage_first_seen_on_the_finish_chunk_is_the_total_not_a_chunk(tmp_path):
    with ServerThread(make_app(usage_on_finish=True)) as server:  # llama-server's /v1/completions
        result = _run(tmp_path, server.url, "--num-prompts", "2", "--random-input-len", "4",
                      "--random-output-len", "5", "--ignore-eos")
    reqs = result["requests"]
    assert reqs["output_lens"] == [5, 5] and reqs["input_lens"] == [4, 4]
    assert reqs["chunk_tokens"] == [[1, 1, 1], [1, 1, 1]]  # chunks of 1, 2, 2 tokens; the finish chunk is none
    assert [len(itl) for itl in reqs["itls"]] == [2, 2]
