"""Every FastDeploy launch flag is known to fd-serve and LLM(**kwargs): implemented, accepted with
an INFO line saying why it has no effect, or refused at start-up naming the flag. Never argparse's
"unrecognized arguments"."""

from __future__ import annotations

import logging
import shlex

import pytest

from fd_core.config import EngineArgs, UnsupportedFeatureError
from fd_core.entrypoints.cli import (
    build_parser,
    engine_args_from,
    fastdeploy_flag_notes,
    server_kwargs_from,
)
from fd_core.flags import FLAGS, FlagError, by_dest

# FastDeploy 2.x's launch flags as it registers them: the api_server's own flags, then
# EngineArgs.add_cli_args (fastdeploy/entrypoints/openai/utils.py, fastdeploy/engine/args_utils.py)
FASTDEPLOY_SERVER_FLAGS = [
    "--port", "--host", "--workers", "--metrics-port", "--controller-port", "--max-waiting-time",
    "--max-concurrency", "--enable-mm-output", "--timeout-graceful-shutdown", "--timeout", "--api-key",
]
FASTDEPLOY_ENGINE_FLAGS = [
    "--model", "--served-model-name", "--revision", "--model-config-name", "--tokenizer",
    "--tokenizer-base-url", "--max-model-len", "--block-size", "--task", "--runner", "--convert",
    "--override-pooler-config", "--use-warmup", "--limit-mm-per-prompt", "--mm-processor-kwargs",
    "--max-encoder-cache", "--max-processor-cache", "--enable-mm", "--reasoning-parser",
    "--chat-template", "--tool-call-parser", "--tool-parser-plugin", "--speculative-config",
    "--dynamic-load-weight", "--load-strategy", "--rsync-config", "--engine-worker-queue-port",
    "--quantization", "--graph-optimization-config", "--plas-attention-config",
    "--guided-decoding-backend", "--guided-decoding-disable-any-whitespace", "--enable-logprob",
    "--enable-keep-sampling-mask", "--max-logprobs", "--logprobs-mode", "--seed",
    "--enable-early-stop", "--early-stop-config", "--lm_head-fp32", "--logits-processors",
    "--enable-entropy", "--model-impl",
    "--tensor-parallel-size", "--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion",
    "--use-internode-ll-two-stage", "--disable-sequence-parallel-moe", "--max-num-seqs",
    "--num-gpu-blocks-override", "--max-num-batched-tokens", "--gpu-memory-utilization",
    "--data-parallel-size", "--local-data-parallel-id", "--enable-expert-parallel", "--enable-eplb",
    "--eplb-config", "--routing-replay-config", "--enable-chunked-moe", "--chunked-moe-size",
    "--shutdown-comm-group-if-worker-idle",
    "--load-choices",
    "--kv-cache-ratio", "--swap-space", "--prealloc-dec-block-slot-num-threshold", "--cache-queue-port",
    "--static-decode-blocks", "--kvcache-storage-backend", "--write-policy",
    "--ips",
    "--enable-prefix-caching", "--enable-output-caching", "--enable-chunked-prefill",
    "--max-num-partial-prefills", "--max-long-partial-prefills", "--long-prefill-token-threshold",
    "--disable-chunked-mm-input",
    "--splitwise-role", "--cache-transfer-protocol", "--pd-comm-port", "--rdma-comm-ports",
    "--router",
    "--scheduler-name", "--scheduler-max-size", "--scheduler-ttl", "--scheduler-host", "--scheduler-port",
    "--scheduler-db", "--scheduler-password", "--scheduler-topic", "--scheduler-min-load-score",
    "--scheduler-load-shards-num", "--scheduler-sync-period", "--scheduler-expire-period",
    "--scheduler-release-load-expire-period", "--scheduler-reader-parallel",
    "--scheduler-writer-parallel", "--scheduler-reader-batch-size", "--scheduler-writer-batch-size",
    "--enable-overlap-schedule",
]
FASTDEPLOY_FLAGS = FASTDEPLOY_SERVER_FLAGS + FASTDEPLOY_ENGINE_FLAGS
# older 2.x spellings still in FastDeploy's best-practice pages, aliases and --no- forms
FASTDEPLOY_OTHER_SPELLINGS = [
    "--use-cudagraph", "--innode-prefill-ports", "--load_choices", "-tp",
    "--no-enable-prefix-caching", "--no-enable-output-caching", "--no-shutdown-comm-group-if-worker-idle",
]


def _options() -> dict[str, object]:
    return build_parser()._option_string_actions  # noqa: SLF001 - the registered spellings


@pytest.mark.parametrize("flag", FASTDEPLOY_FLAGS + FASTDEPLOY_OTHER_SPELLINGS)
def test_every_fastdeploy_flag_is_known_in_both_spellings(flag):
    options = _options()
    assert flag in options
    if flag.startswith("--") and not flag.startswith("--no-"):
        body = flag[2:]
        assert "--" + body.replace("-", "_") in options  # --max_model_len as well as --max-model-len
        assert "--" + body.replace("_", "-") in options


@pytest.mark.parametrize("flag", FASTDEPLOY_FLAGS)
def test_every_fastdeploy_flag_lands_in_one_class(flag):
    entry = by_dest(flag.lstrip("-"))
    assert entry is not None, f"{flag} is not in fd_core.flags.FLAGS"
    assert entry.kind in ("engine", "server", "no_effect", "not_yet", "unsupported")
    if entry.kind in ("no_effect", "not_yet", "unsupported"):
        assert entry.reason, flag


def _sample(flag) -> list[str]:
    """Command-line words giving ``flag`` a value that is not its neutral one."""
    if flag.type is bool:
        return [flag.name]
    samples = {str: "x", int: "7", float: "0.5"}
    value = flag.values[0] if flag.values else samples.get(flag.type, '{"a": 1}')
    if flag.name in ("--ips",):
        value = "10.0.0.1,10.0.0.2"
    if flag.name in ("--enable-output-caching", "--shutdown-comm-group-if-worker-idle",
                     "--guided-decoding-disable-any-whitespace"):
        value = "true"
    return [flag.name, value]


NO_EFFECT = [f for f in FLAGS if f.kind == "no_effect"]
REFUSED = [f for f in FLAGS if f.kind in ("not_yet", "unsupported")]


@pytest.mark.parametrize("flag", NO_EFFECT, ids=lambda f: f.name)
def test_a_no_effect_flag_is_accepted_with_one_info_line_naming_it(flag, caplog):
    ns = build_parser().parse_args(["--model", "m", *_sample(flag)])
    with caplog.at_level(logging.INFO, logger="fd_core.serve"):
        args = engine_args_from(ns)
    assert isinstance(args, EngineArgs)
    lines = [r.getMessage() for r in caplog.records if flag.name in r.getMessage()]
    assert len(lines) == 1 and "has no effect here" in lines[0], lines


@pytest.mark.parametrize("flag", REFUSED, ids=lambda f: f.name)
def test_a_flag_for_a_missing_feature_is_refused_naming_it(flag):
    ns = build_parser().parse_args(["--model", "m", *_sample(flag)])
    with pytest.raises(FlagError) as info:
        engine_args_from(ns)
    message = str(info.value)
    assert message.startswith(flag.name) and flag.reason in message
    if flag.kind == "not_yet":
        assert "is not implemented yet (issue" in message


@pytest.mark.parametrize("words", [
    ["--splitwise-role", "mixed"], ["--scheduler-name", "local"], ["--data-parallel-size", "1"],
    ["--task", "generate"], ["--max-encoder-cache", "-1"],
    ["--graph-optimization-config", '{"use_cudagraph": false}'], ["--controller-port", "-1"],
])
def test_the_neutral_value_of_a_missing_feature_is_accepted(words):
    ns = build_parser().parse_args(["--model", "m", *words])
    assert fastdeploy_flag_notes(ns) == []
    engine_args_from(ns)


def test_implemented_flags_reach_the_engine_and_server_arguments():
    ns = build_parser().parse_args(shlex.split(
        "--model m --max_model_len 4096 --max-num-seqs 16 --seed 7 --lm_head-fp32 --swap-space 2 "
        "--max-num-partial-prefills 2 --max-long-partial-prefills 1 --long-prefill-token-threshold 64 "
        "--enable-early-stop --early-stop-config '{\"window_size\": 5, \"threshold\": 0.9}' "
        "--logits-processors fd_core.sampling.logits_processors:LogitBiasLogitsProcessor "
        "--max-logprobs 5 --api-key k1 --api-key k2 --max-waiting-time 30 --revision main "
        "--disallow-request-chat-template -tp 1"))
    args = engine_args_from(ns)
    assert (args.max_model_len, args.max_num_seqs, args.seed, args.lm_head_fp32) == (4096, 16, 7, True)
    assert (args.max_num_partial_prefills, args.long_prefill_token_threshold, args.swap_space) == (2, 64, 2.0)
    assert args.enable_early_stop and args.early_stop_config == {"window_size": 5, "threshold": 0.9}
    assert args.logits_processors == ["fd_core.sampling.logits_processors:LogitBiasLogitsProcessor"]
    assert (args.max_logprobs, args.revision) == (5, "main")
    server = server_kwargs_from(ns)
    assert server["api_keys"] == ("k1", "k2") and server["max_waiting_time"] == 30
    assert server["allow_request_chat_template"] is False


@pytest.mark.parametrize("words, message", [
    (["--max-logprobs", "-1"], "--max-logprobs must be in [0, 20]"),
    (["--max-waiting-time", "0"], "--max-waiting-time must be > 0 seconds or -1"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--max-long-partial-prefills", "0"], "--max-long-partial-prefills must be a positive integer"),
    (["--max-long-partial-prefills", "2"], "--max-long-partial-prefills 2 exceeds --max-num-partial-prefills 1"),
    (["--enable-early-stop", "--early-stop-config", '{"threshold": 2}'], "--early-stop-config threshold"),
    (["--enable-early-stop", "--early-stop-config", '{"windows": 2}'], "windows"),
    (["--logits-processors", "nonexist:Foo"], "--logits-processors 'nonexist:Foo': no module named 'nonexist'"),
    (["--chat-template", "/nonexistent.jinja"], "is neither a readable file nor a jinja template"),
    (["--chat-template", "{% for x in %}"], "--chat-template: not a valid jinja template"),
])
def test_bad_values_of_implemented_flags_name_the_flag(words, message):
    ns = build_parser().parse_args(["--model", "m", *words])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        engine_args_from(ns)


def test_llm_kwargs_take_fastdeploy_names(caplog):
    with caplog.at_level(logging.INFO, logger="fd_core.config"):
        args = EngineArgs.from_kwargs("m", enable_logprob=True, load_choices="default_v1", kv_cache_ratio=0.9,
                                      engine_worker_queue_port=[8182], port=8180, splitwise_role="mixed")
    assert args.model == "m"
    text = "\n".join(r.getMessage() for r in caplog.records)
    for name in ("--enable-logprob", "--load-choices", "--kv-cache-ratio", "port"):
        assert name in text
    with pytest.raises(UnsupportedFeatureError, match="--enable-eplb: expert-parallel load balancing is not"):
        EngineArgs.from_kwargs("m", enable_eplb=True)
    with pytest.raises(TypeError, match="unknown engine argument.*max_modle_len"):
        EngineArgs.from_kwargs("m", max_modle_len=4)


def test_tool_parser_plugin_registers_a_parser_from_a_file(tmp_path):
    from fd_core.parsers import ToolParserManager

    plugin = tmp_path / "my_parser.py"
    plugin.write_text(
        "from fd_core.parsers import ToolParserManager\n"
        "from fd_core.parsers.base import ExtractedToolCalls, ToolParser\n\n"
        "@ToolParserManager.register_module('my-plugin-parser')\n"
        "class MyParser(ToolParser):\n"
        "    def extract_tool_calls(self, model_output, request=None):\n"
        "        return ExtractedToolCalls(tools_called=False, tool_calls=[], content=model_output)\n"
    )
    ns = build_parser().parse_args(["--model", "m", "--tool-parser-plugin", str(plugin),
                                    "--tool-call-parser", "my-plugin-parser"])
    engine_args_from(ns)
    assert ToolParserManager.get("my_plugin_parser").__name__ == "MyParser"
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="--tool-parser-plugin .*broken.py failed to import: RuntimeError: boom"):
        engine_args_from(build_parser().parse_args(["--model", "m", "--tool-parser-plugin", str(broken)]))
    with pytest.raises(ValueError, match="no such file"):
        engine_args_from(build_parser().parse_args(["--model", "m", "--tool-parser-plugin", "/nope.py"]))


def test_lm_head_fp32_keeps_the_head_float_and_refuses_a_quantized_head():
    from fd_core.quantization.config import parse_quantization

    assert parse_quantization({"quantization": "wint8", "lm_head_quant_type": "wint8"}).lm_head_method == "wint8"
    assert parse_quantization("wint8").lm_head_method is None  # float head by default, as FastDeploy
    ns = build_parser().parse_args(["--model", "m", "--quantization",
                                    '{"quantization": "wint8", "lm_head_quant_type": "wint8"}', "--lm_head-fp32"])
    with pytest.raises(ValueError, match="--lm_head-fp32 keeps the LM head float"):
        engine_args_from(ns)


def test_the_readme_names_every_flag_and_its_reason():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Coming from FastDeploy"):]
    for flag in FLAGS:
        if flag.kind in ("no_effect", "not_yet", "unsupported"):
            assert f"`{flag.name}`" in section and flag.reason in section, flag.name


def test_a_no_effect_flag_still_checks_its_value():
    ns = build_parser().parse_args(["--model", "m", "--load-choices", "dummy"])
    with pytest.raises(ValueError, match="--load-choices must be one of default, default_v1, got 'dummy'"):
        engine_args_from(ns)
