"""fd-bench compare: one token-id request stream through two fake servers, one after the other."""

from __future__ import annotations

import json
import socket

import pytest
from fastapi.responses import JSONResponse

from fd_core.benchmarks.cli import main

from .fake_server import ServerThread, make_app


@pytest.fixture(scope="module")
def tokenizer_dir(checkpoint_factory) -> str:
    # module scope: made before capsys swaps stderr (sentencepiece's trainer needs its fileno)
    return str(checkpoint_factory("tiny-dense"))


def _compare(tmp_path, *argv: str) -> int:
    return main(["compare", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "c.json", *argv])


def _measured(app) -> list[dict]:
    return app.state.bodies[1:]  # the first is the token-id probe


def test_two_servers_get_the_identical_stream_and_the_ratio_table_shows_the_gap(tmp_path, capsys):
    fast_app, slow_app = make_app(delay=0.0005), make_app(delay=0.03)
    with ServerThread(fast_app) as fast, ServerThread(slow_app) as slow:
        code = _compare(tmp_path, "--base-url", fast.url, "--label", "fast", "--base-url", slow.url,
                        "--label", "slow", "--num-prompts", "6", "--random-input-range", "4:12",
                        "--random-output-range", "3:8", "--request-rate", "200", "--seed", "5")
    assert code == 0
    out = capsys.readouterr().out
    assert "slow/fast" in out and "Output token throughput (tok/s)" in out and "P99 TTFT (ms)" in out
    assert "every server got the identical request stream" in out
    assert "prompt form sent: fast: token_ids, slow: token_ids" in out

    fast_bodies, slow_bodies = _measured(fast_app), _measured(slow_app)
    assert len(fast_bodies) == len(slow_bodies) == 6

    def stream(bodies):
        return sorted((tuple(b["prompt"]), b["max_tokens"]) for b in bodies)

    assert stream(fast_bodies) == stream(slow_bodies)
    for b in fast_bodies + slow_bodies:
        assert all(isinstance(t, int) for t in b["prompt"]) and 4 <= len(b["prompt"]) <= 12
        assert 3 <= b["max_tokens"] <= 8 and b["ignore_eos"] is True and b["temperature"] == 0.0
    # one server after the other: the slow server saw nothing before the fast one had finished
    assert max(end for _, end in fast_app.state.spans) <= min(start for start, _ in slow_app.state.spans)

    result = json.loads((tmp_path / "c.json").read_text())
    assert result["kind"] == "compare"
    a, b = result["servers"]
    assert (a["label"], b["label"]) == ("fast", "slow")
    assert a["sent_sha256"] == b["sent_sha256"] == result["stream_sha256"]
    assert a["requests"]["max_tokens"] == b["requests"]["max_tokens"]
    assert a["requests"]["output_lens"] == a["requests"]["max_tokens"] == b["requests"]["output_lens"]
    assert len(result["arrivals"]) == 6 and result["arrivals"] == sorted(result["arrivals"])
    ratios = result["ratios"]["slow"]
    assert ratios["output_throughput"] == pytest.approx(
        b["summary"]["output_throughput"] / a["summary"]["output_throughput"])
    assert ratios["completed"] == 1.0
    # 30 ms before every chunk of two tokens against 0.5 ms: far apart on any machine
    assert ratios["median_tpot_ms"] > 1.0 and ratios["output_throughput"] < 1.0


def test_the_same_seed_gives_the_same_stream_and_schedule(tmp_path):
    results = []
    for run in range(2):
        with ServerThread(make_app(delay=0)) as s1, ServerThread(make_app(delay=0)) as s2:
            assert _compare(tmp_path, "--base-url", s1.url, "--base-url", s2.url, "--num-prompts", "4",
                            "--random-input-range", "3:6", "--random-output-range", "2:3",
                            "--request-rate", "500", "--result-filename", f"{run}.json") == 0
        results.append(json.loads((tmp_path / f"{run}.json").read_text()))
    assert results[0]["stream_sha256"] == results[1]["stream_sha256"]
    assert results[0]["arrivals"] == results[1]["arrivals"]
    assert [s["label"] for s in results[0]["servers"]] == ["A", "B"]


def test_a_server_refusing_token_ids_gets_text_only_when_asked(tmp_path, tokenizer_dir, capsys):
    ids_app, text_app = make_app(delay=0), make_app(delay=0, accept_token_ids=False)
    argv = ("--num-prompts", "3", "--random-input-range", "4:8", "--random-output-range", "2:4")
    with ServerThread(ids_app) as s1, ServerThread(text_app) as s2:
        assert _compare(tmp_path, "--base-url", s1.url, "--base-url", s2.url, *argv) == 2
        assert "--text-fallback" in capsys.readouterr().err
        assert _compare(tmp_path, "--base-url", s1.url, "--base-url", s2.url, "--text-fallback",
                        "--tokenizer", tokenizer_dir, *argv) == 0
    assert "prompt form sent: A: token_ids, B: text" in capsys.readouterr().out
    result = json.loads((tmp_path / "c.json").read_text())
    assert [s["prompt_form"] for s in result["servers"]] == ["token_ids", "text"]
    sent_ids = [b["prompt"] for b in ids_app.state.bodies[-3:]]
    sent_text = [b["prompt"] for b in text_app.state.bodies[-3:]]
    assert all(isinstance(p, list) for p in sent_ids) and all(isinstance(p, str) for p in sent_text)
    from fd_core.tokenizer import Tokenizer

    decode = Tokenizer.from_pretrained(tokenizer_dir).decode
    assert sorted(sent_text) == sorted(decode(p) for p in sent_ids)


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("argv, flag", [
    (["serve", "--random-input-range", "9:5"], "--random-input-range"),
    (["serve", "--random-output-range", "-1:4"], "--random-output-range"),
    (["serve", "--random-input-range", "a:b"], "--random-input-range"),
    (["serve", "--random-output-range", "1.5:3"], "--random-output-range"),
    (["serve", "--random-input-range", "0:3"], "--random-input-range"),
    (["serve", "--random-input-len", "8", "--random-input-range", "4:8"], "--random-input-range"),
    (["compare", "--random-input-range", "4:8", "--random-output-range", "2:3",
      "--random-range-ratio", "0.5", "--base-url", "X", "--base-url", "Y"], "--random-range-ratio"),
    (["compare", "--base-url", "X"], "--base-url"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--label", "a"], "--label"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--label", "a", "--label", "a"], "--label"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--base-url", "Z", "--model", "m", "--model", "n"],
     "--model"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--text-fallback"], "--text-fallback"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--extra-body", '{"max_tokens": 3}'], "--extra-body"),
    (["compare", "--base-url", "X", "--base-url", "Y", "--endpoint", "/v1/chat/completions"], "--endpoint"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    url = _free_url()  # nothing listens: a flag the run got past would fail on connecting instead
    argv = [url if a in ("X", "Y", "Z") else a for a in argv]
    if argv[0] == "serve":
        argv += ["--base-url", url]
    try:
        code = main([*argv, "--num-prompts", "2", "--disable-tqdm"])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert flag in err and "cannot reach" not in err


def test_fd_serve_takes_the_compare_stream(tmp_path, tokenizer_dir):
    """A real fd-serve as B: token-id prompts without BOS, ignore_eos, every output to its length."""
    from fd_core.benchmarks.compare import ServerProcess

    with ServerThread(make_app(delay=0)) as fake, ServerProcess(
            tokenizer_dir, ["--backend", "cpu", "--max-model-len", "64", "--num-gpu-blocks-override", "16",
                            "--block-size", "16"], tmp_path / "serve.log") as server:
        assert _compare(tmp_path, "--base-url", fake.url, "--base-url", server.url, "--model", "fake-model",
                        "--model", tokenizer_dir, "--num-prompts", "4", "--random-input-range", "4:20",
                        "--random-output-range", "2:6", "--random-vocab-size", "1000",
                        "--request-rate", "50") == 0
    a, b = json.loads((tmp_path / "c.json").read_text())["servers"]
    assert b["prompt_form"] == "token_ids" and b["summary"]["completed"] == 4
    assert b["requests"]["input_lens"] == a["requests"]["input_lens"]  # the server's own count: no BOS added
    assert b["requests"]["output_lens"] == b["requests"]["max_tokens"] == a["requests"]["max_tokens"]


def test_a_wrong_model_is_not_taken_for_a_refused_prompt(tmp_path, capsys):
    app = make_app(delay=0)

    @app.middleware("http")
    async def only_fake_model(request, call_next):  # fd-serve answers an unknown model with a 404
        if request.method == "POST" and (await request.json()).get("model") != "fake-model":
            return JSONResponse({"error": {"message": "The model `x` does not exist."}}, status_code=404)
        return await call_next(request)

    with ServerThread(app) as s1, ServerThread(make_app(delay=0)) as s2:
        assert _compare(tmp_path, "--base-url", s2.url, "--base-url", s1.url, "--model", "other",
                        "--num-prompts", "2", "--random-input-range", "4:8",
                        "--random-output-range", "2:3") == 2
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "--model" in err and "--text-fallback" not in err


def test_the_arrival_bound_is_printed_and_saved(tmp_path, capsys):
    app = make_app(delay=0.0005)
    with ServerThread(app) as a, ServerThread(make_app(delay=0.0005)) as b:
        code = _compare(tmp_path, "--base-url", a.url, "--base-url", b.url, "--num-prompts", "5",
                        "--random-input-range", "4:8", "--random-output-range", "3:6", "--request-rate", "20",
                        "--seed", "2")
    assert code == 0
    result = json.loads((tmp_path / "c.json").read_text())
    bound = result["arrival_bound"]
    last = result["arrivals"][-1]
    total_out = sum(result["servers"][0]["requests"]["max_tokens"])
    assert bound["last_arrival_s"] == pytest.approx(last)
    assert bound["bound_tok_s"] == pytest.approx(total_out / last)
    # no server can beat the schedule: its duration is at least the last arrival
    for server in result["servers"]:
        mine = bound["servers"][server["label"]]
        assert mine["share"] == pytest.approx(server["summary"]["output_throughput"] / bound["bound_tok_s"])
        assert 0 < mine["share"] <= 1.0
        assert mine["drain_s"] >= 0 and mine["median_e2el_s"] > 0
    out = capsys.readouterr().out
    assert f"last request scheduled at {last:.1f} s" in out and "drained" in out


def test_all_at_once_has_no_arrival_bound(tmp_path, capsys):
    with ServerThread(make_app(delay=0.0005)) as a, ServerThread(make_app(delay=0.0005)) as b:
        code = _compare(tmp_path, "--base-url", a.url, "--base-url", b.url, "--num-prompts", "3",
                        "--random-input-range", "4:8", "--random-output-range", "3:6", "--seed", "2")
    assert code == 0
    assert json.loads((tmp_path / "c.json").read_text())["arrival_bound"] == {}
    assert "every request sent at once" in capsys.readouterr().out
