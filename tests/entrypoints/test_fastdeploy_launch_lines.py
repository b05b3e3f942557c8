"""The launch lines of FastDeploy's ERNIE 4.5 best-practice pages, with the model swapped for a
generated checkpoint of that architecture: each serves, or is refused at start-up (exit 2) naming
a flag whose feature a later issue builds. None fails with "unrecognized arguments" or a traceback."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import httpx
import pytest

from fd_core.config import UnsupportedFeatureError
from fd_core.entrypoints.cli import build_parser, engine_args_from

# (page, launch line after "python -m fastdeploy.entrypoints.openai.api_server", checkpoint,
#  the flag that refuses it or None when it serves)
LINES = [
    ("ERNIE-4.5-0.3B-Paddle", "--model M --tensor-parallel-size 1 --quantization wint4 "
     "--max-model-len 32768 --max-num-seqs 128", "dense", None),
    ("ERNIE-4.5-0.3B-Paddle (<= 2.1 extras)", "--model M --tensor-parallel-size 1 --quantization wint4 "
     "--max-model-len 32768 --max-num-seqs 128 --enable-prefix-caching --swap-space 50 "
     "--enable-chunked-prefill", "dense", None),
    ("ERNIE-4.5-21B-A3B-Paddle", "--model M --tensor-parallel-size 1 --quantization wint4 "
     "--max-model-len 32768 --max-num-seqs 128", "moe", None),
    ("ERNIE-4.5-21B-A3B-Paddle MTP", "--model M --tensor-parallel-size 1 --quantization wint4 "
     "--max-model-len 32768 --max-num-seqs 128 --speculative-config "
     "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1, \"model\": \"/mtp\"}'", "moe",
     None),  # serves: tests/spec_decode/test_mtp_engine.py
    ("ERNIE-4.5-21B-A3B-Paddle PD prefill", "--model M --max-model-len 131072 --max-num-seqs 20 "
     "--num-gpu-blocks-override 40000 --quantization block_wise_fp8 --gpu-memory-utilization 0.9 "
     "--kv-cache-ratio 0.9 --port 7012 --engine-worker-queue-port 7013 --metrics-port 7014 "
     "--tensor-parallel-size 4 --cache-queue-port 7015 --splitwise-role prefill", "moe", "--"),
    ("ERNIE-4.5-21B-A3B-Paddle PD decode", "--model M --max-model-len 131072 --max-num-seqs 20 "
     "--quantization block_wise_fp8 --gpu-memory-utilization 0.85 --kv-cache-ratio 0.1 --port 9012 "
     "--engine-worker-queue-port 8013 --metrics-port 8014 --tensor-parallel-size 4 --cache-queue-port 8015 "
     "--innode-prefill-ports 7013 --splitwise-role decode", "moe", "--"),
    ("ERNIE-4.5-21B-A3B-Thinking", "--model M --tensor-parallel-size 1 --max-model-len 131072 "
     "--quantization wint8 --reasoning-parser ernie-x1 --tool-call-parser ernie-x1 --max-num-seqs 32",
     "moe", None),
    ("ERNIE-4.5-300B-A47B-Paddle", "--model M --tensor-parallel-size 8 --quantization wint4 "
     "--max-model-len 32768 --max-num-seqs 128", "moe", None),
    ("ERNIE-4.5-300B-A47B-Paddle PD prefill", "--model M --port 8180 --metrics-port 8181 "
     "--engine-worker-queue-port 8182 --cache-queue-port 8183 --tensor-parallel-size 4 "
     "--quantization wint4 --splitwise-role prefill", "moe", "--"),
    ("ERNIE-4.5-300B-A47B-Paddle PD decode", "--model M --port 8184 --metrics-port 8185 "
     "--engine-worker-queue-port 8186 --cache-queue-port 8187 --tensor-parallel-size 4 --quantization wint4 "
     "--innode-prefill-ports 8182 --splitwise-role decode", "moe", "--"),
    ("ERNIE-4.5-VL-424B-A47B-Paddle", "--model M --port 8180 --metrics-port 8181 "
     "--engine-worker-queue-port 8182 --tensor-parallel-size 8 --max-model-len 131072 --max-num-seqs 16 "
     "--limit-mm-per-prompt '{\"image\": 100, \"video\": 100}' --reasoning-parser ernie-45-vl "
     "--gpu-memory-utilization 0.85 --max-num-batched-tokens 384 --quantization wint4", "vl", None),
    ("XPU 300B", "--model M --port 8188 --tensor-parallel-size 4 --max-model-len 32768 --max-num-seqs 64 "
     "--quantization wint4 --gpu-memory-utilization 0.9 --load-choices default", "moe", None),
    ("XPU VL-28B", "--model M --port 8188 --tensor-parallel-size 1 --quantization wint8 "
     "--max-model-len 32768 --max-num-seqs 10 --enable-mm --mm-processor-kwargs '{\"video_max_frames\": 30}' "
     "--limit-mm-per-prompt '{\"image\": 10, \"video\": 3}' --reasoning-parser ernie-45-vl "
     "--load-choices default", "vl", None),
    ("XPU PaddleOCR-VL line", "--model M --port 8188 --metrics-port 8181 --engine-worker-queue-port 8182 "
     "--max-model-len 16384 --max-num-batched-tokens 16384 --gpu-memory-utilization 0.8 --max-num-seqs 256",
     "dense", None),
    ("disaggregated.md prefill (RDMA)", "--model M --port 8180 --metrics-port 8181 "
     "--engine-worker-queue-port 8182 --cache-queue-port 8183 --tensor-parallel-size 4 --quantization wint4 "
     "--cache-transfer-protocol rdma,ipc --rdma-comm-ports 7671,7672,7673,7674 --pd-comm-port 2334 "
     "--splitwise-role prefill --scheduler-name splitwise --scheduler-host 127.0.0.1 --scheduler-port 6379 "
     "--scheduler-ttl 9000", "moe", "--"),
]
LATER_ISSUE_FLAGS = ("--speculative-config", "--splitwise-role", "--enable-mm",
                     "--limit-mm-per-prompt", "--mm-processor-kwargs", "--scheduler-name",
                     "--innode-prefill-ports", "--quantization block_wise_fp8")


def _words(line: str, model: str) -> list[str]:
    return [model if w == "M" else w for w in shlex.split(line)]


@pytest.mark.parametrize("page, line, arch, refused_by", LINES, ids=[x[0] for x in LINES])
def test_launch_line_parses_and_serves_or_is_refused_naming_a_later_feature(page, line, arch, refused_by):
    ns = build_parser().parse_args(_words(line, "/models/x"))  # argparse exits 2 on an unknown flag
    if refused_by is None:
        assert engine_args_from(ns).model == "/models/x"
        return
    with pytest.raises(UnsupportedFeatureError) as info:
        engine_args_from(ns)
    message = str(info.value)
    assert message.startswith(refused_by), message
    assert any(message.startswith(flag) for flag in LATER_ISSUE_FLAGS), message
    assert "not implemented yet" in message or "FastDeploy method" in message, message


def _serve(words: list[str], tmp_path, **env: str) -> tuple[int, str, dict | None]:
    """Start fd-serve with ``words`` on a free port; return (exit code or 0 when it served, log, models)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    words = [w for w in words]
    if "--port" in words:
        words[words.index("--port") + 1] = str(port)
    else:
        words += ["--port", str(port)]
    if "--metrics-port" in words:
        words = words[: words.index("--metrics-port")] + words[words.index("--metrics-port") + 2:]
    log = tmp_path / "serve.log"
    env = {**os.environ, "FD_CPU_KVCACHE_SPACE": "0.25", "FD_LOG_DIR": str(tmp_path / "log"), **env}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--host",
                                 "127.0.0.1", "--backend", "cpu", *words], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        try:
            for _ in range(600):
                if proc.poll() is not None:
                    return proc.returncode, log.read_text(), None
                try:
                    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30, json={
                        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
                    if r.status_code == 200:
                        return 0, log.read_text(), r.json()
                except httpx.HTTPError:
                    pass
                import time

                time.sleep(0.2)
            raise AssertionError("server did not come up:\n" + log.read_text())
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)


@pytest.mark.parametrize("page", [
    "ERNIE-4.5-21B-A3B-Thinking", "ERNIE-4.5-0.3B-Paddle (<= 2.1 extras)",
    pytest.param("ERNIE-4.5-21B-A3B-Paddle", marks=pytest.mark.slow),
    pytest.param("XPU PaddleOCR-VL line", marks=pytest.mark.slow),
    pytest.param("XPU 300B", marks=pytest.mark.slow),  # --tensor-parallel-size 4: four ranks on the CPU
])
def test_launch_line_really_serves_a_generated_checkpoint(page, checkpoint_factory, tmp_path):
    _, line, arch, _ = next(x for x in LINES if x[0] == page)
    shape = "tiny-dense" if arch == "dense" else "tiny-moe"
    model = checkpoint_factory(shape, "paddle", max_position_embeddings=131072)
    code, log, answer = _serve(_words(line, str(model)), tmp_path)
    assert code == 0 and answer is not None, log
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert "Traceback" not in log and "unrecognized arguments" not in log


def test_a_refused_launch_line_exits_2_naming_the_flag_before_loading(checkpoint_factory, tmp_path):
    _, line, _, _ = next(x for x in LINES if x[0] == "ERNIE-4.5-300B-A47B-Paddle PD prefill")
    model = checkpoint_factory("tiny-moe", "paddle")
    code, log, _ = _serve(_words(line, str(model)), tmp_path)
    assert code == 2, log
    assert "fd-serve: error: --" in log and "not implemented yet (issue" in log, log
    assert "Traceback" not in log


def test_disable_log_requests_leaves_no_line_per_request(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "paddle")
    words = ["--model", str(model), "--max-model-len", "256", "--num-gpu-blocks-override", "64"]
    code, log, _ = _serve(words, tmp_path)
    assert code == 0 and " done: prompt " in log and '"POST /v1/chat/completions HTTP/1.1" 200' in log, log
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    code, log, _ = _serve([*words, "--disable-log-requests"], quiet)
    assert code == 0, log
    assert " done: prompt " not in log and "POST /v1/chat/completions" not in log, log


@pytest.mark.parametrize("words, env, message", [
    (["--max-concurrency", "0"], {}, "--max-concurrency must be >= 1"),
    ([], {"FD_SAMPLING_CLASS": "foo"}, "environment variable FD_SAMPLING_CLASS"),
    (["--logits-processors", "nonexist:Foo"], {}, "no module named 'nonexist'"),
])
def test_bad_server_flags_and_variables_exit_2_before_the_engine_starts(words, env, message, checkpoint_factory,
                                                                        tmp_path):
    model = checkpoint_factory("tiny-dense", "paddle")
    code, log, _ = _serve(["--model", str(model), *words], tmp_path, **env)
    assert code == 2 and message in log, log
    assert "Traceback" not in log and "starting the engine process" not in log, log
