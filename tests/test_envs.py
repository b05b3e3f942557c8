"""FD_* variables: every one FastDeploy documents is known (read, no effect with a
reason, or not implemented yet); start-up says so; typos are named; secrets masked."""

from __future__ import annotations

import logging
import os

import pytest

from fd_core import envs
from fd_core.env_catalog import NO_EFFECT, NOT_IMPLEMENTED
from fd_core.masking import is_secret_name, mask_secrets

# FastDeploy's docs/usage/environment_variables.md (latest), plus variables its
# best-practice pages set (INFERENCE_MSG_QUEUE_ID, FD_ATTENTION_BACKEND=FLASH_ATTN)
DOCUMENTED = """
FD_CPU_USE_BF16 FD_BUILDING_ARCS FD_LOG_DIR FD_DEBUG FD_LOG_BACKUP_COUNT FD_MODEL_SOURCE FD_MODEL_CACHE
FD_MAX_STOP_SEQS_NUM FD_STOP_SEQS_MAX_LEN FD_USE_HF_TOKENIZER FD_ZMQ_SNDHWM FD_CACHE_PARAMS
FD_ATTENTION_BACKEND FD_SAMPLING_CLASS FD_MOE_BACKEND FD_USE_MACHETE FD_DISABLED_RECOVER
FD_TRITON_KERNEL_CACHE_DIR FD_PD_CHANGEABLE FD_USE_DEEP_GEMM FD_USE_AGGREGATE_SEND TRACES_ENABLE
FD_SERVICE_NAME FD_HOST_NAME TRACES_EXPORTER EXPORTER_OTLP_ENDPOINT EXPORTER_OTLP_HEADERS
ENABLE_V1_KVCACHE_SCHEDULER FD_ENC_DEC_BLOCK_NUM FD_ENABLE_MAX_PREFILL FD_PLUGINS FD_JOB_ID
FD_SUPPORT_MAX_CONNECTIONS FD_TP_GROUP_GID_OFFSET FD_ENABLE_MULTI_API_SERVER FD_FOR_TORCH_MODEL_FORMAT
FD_DISABLE_CHUNKED_PREFILL FD_USE_GET_SAVE_OUTPUT_V1 FD_ENABLE_MODEL_CACHE FD_ENABLE_INTERNAL_ADAPTER
FD_ZMQ_RECV_REQUEST_SERVER_PORT FD_ZMQ_SEND_RESPONSE_SERVER_PORT FD_ZMQ_RECV_REQUEST_SERVER_PORTS
FD_ZMQ_SEND_RESPONSE_SERVER_PORTS FD_ZMQ_CONTROL_CMD_SERVER_PORTS FD_ENABLE_CACHE_TASK
FD_EP_BATCHED_TOKEN_TIMEOUT FD_EP_MAX_PREFETCH_TASK_NUM FD_ENABLE_MODEL_LOAD_CACHE
FD_ENABLE_SWAP_SPACE_CLEARING FD_ENABLE_RETURN_TEXT FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR
FD_CACHE_PROC_EXIT_TIMEOUT FD_CACHE_PROC_ERROR_COUNT FD_API_KEY ENCODE_FEATURE_BOS_AK
ENCODE_FEATURE_BOS_SK ENCODE_FEATURE_ENDPOINT FD_OFFLINE_PERF_TEST_FOR_PD FD_ENABLE_E2W_TENSOR_CONVERT
FD_ENGINE_TASK_QUEUE_WITH_SHM FD_FILL_BITMASK_BATCH FD_ENABLE_PDL FD_GUIDANCE_DISABLE_ADDITIONAL
FD_LLGUIDANCE_LOG_LEVEL FD_HPU_CHUNK_SIZE FD_HPU_MEASUREMENT_MODE FD_PREFILL_WAIT_DECODE_RESOURCE_SECONDS
FMQ_CONFIG_JSON FD_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS FD_OTLP_EXPORTER_MAX_EXPORT_BATCH_SIZE
FD_TOKEN_PROCESSOR_HEALTH_TIMEOUT FD_XPU_MOE_FFN_QUANT_TYPE_MAP FD_WORKER_ALIVE_TIMEOUT
FD_DEBUG_SERIALIZE_MODEL_PATH FD_LOG_LEVEL INFERENCE_MSG_QUEUE_ID
""".split()


@pytest.fixture
def clean_env(monkeypatch):
    """No FD_* or catalogued variable from the machine leaks into a test."""
    for name in list(os.environ):
        if name.startswith("FD_") or name in NO_EFFECT or name in NOT_IMPLEMENTED:
            monkeypatch.delenv(name)
    envs.reset()
    yield monkeypatch
    envs.reset()


def test_every_documented_variable_is_in_exactly_one_class():
    for name in DOCUMENTED:
        classes = [name in envs.VARIABLES, name in NO_EFFECT, name in NOT_IMPLEMENTED]
        assert sum(classes) == 1, (name, classes)
    assert all(reason for reason in NO_EFFECT.values()) and all(NOT_IMPLEMENTED.values())


def test_start_up_lines_say_what_each_set_variable_does(clean_env, caplog):
    clean_env.setenv("INFERENCE_MSG_QUEUE_ID", "1315")
    clean_env.setenv("FD_USE_DEEP_GEMM", "1")
    clean_env.setenv("FD_ENABLE_MAX_PREFILL", "1")
    clean_env.setenv("ENCODE_FEATURE_BOS_SK", "very-secret")
    clean_env.setenv("FD_ATTENTION_BACKEND", "FLASH_ATTN")
    clean_env.setenv("FD_SAMPLING_CLASS", "rejection")  # read, full effect: no line
    clean_env.setenv("FD_SAMPLNG_CLASS", "rejection")
    clean_env.setenv("FD_LOG_LEVL", "DEBUG")
    logger = logging.getLogger("test.envs")
    with caplog.at_level(logging.INFO, logger="test.envs"):
        envs.log_no_effect(logger)
    lines = {r.getMessage().split("=", 1)[0]: r for r in caplog.records}
    info = lines["INFERENCE_MSG_QUEUE_ID"]
    assert info.levelno == logging.INFO and "has no effect here" in info.getMessage()
    assert "no internal TCP ports" in info.getMessage()
    assert lines["FD_USE_DEEP_GEMM"].levelno == logging.INFO
    assert lines["FD_ENABLE_MAX_PREFILL"].levelno == logging.WARNING
    assert "not implemented yet" in lines["FD_ENABLE_MAX_PREFILL"].getMessage()
    secret = lines["ENCODE_FEATURE_BOS_SK"].getMessage()
    assert "very-secret" not in secret and "***" in secret
    assert "--backend" in lines["FD_ATTENTION_BACKEND"].getMessage()
    assert "FD_SAMPLING_CLASS" not in lines
    unknown = [r for r in caplog.records if "unknown FD_*" in r.getMessage()]
    assert len(unknown) == 1 and unknown[0].levelno == logging.WARNING
    assert "FD_LOG_LEVL" in unknown[0].getMessage() and "FD_SAMPLNG_CLASS" in unknown[0].getMessage()
    assert envs.unknown_variables() == ["FD_LOG_LEVL", "FD_SAMPLNG_CLASS"]


def test_nothing_set_logs_nothing(clean_env, caplog):
    with caplog.at_level(logging.DEBUG, logger="test.envs"):
        envs.log_no_effect(logging.getLogger("test.envs"))
    assert caplog.records == []


@pytest.mark.parametrize("name,raw,expected", [
    ("FD_ATTENTION_BACKEND", "append_attn", "APPEND_ATTN"),
    ("FD_ATTENTION_BACKEND", "FLASH_ATTN", "FLASH_ATTN"),
    ("FD_SAMPLING_CLASS", "air", "base"),
    ("FD_SAMPLING_CLASS", "base_non_truncated", "base"),
    ("FD_MODEL_SOURCE", "huggingface", "HUGGINGFACE"),
    ("FD_DEBUG", "1", True),
    ("FD_LOG_LEVEL", "debug", "DEBUG"),
    ("FD_LOG_BACKUP_COUNT", "3", 3),
    ("FD_API_KEY", "k1,k2", "k1,k2"),
    ("FD_CPU_KVCACHE_SPACE", "", None),
])
def test_typed_values(clean_env, name, raw, expected):
    clean_env.setenv(name, raw)
    envs.reset()
    assert envs.get(name) == expected


@pytest.mark.parametrize("name,raw", [
    ("FD_ATTENTION_BACKEND", "FOO_ATTN"), ("FD_DEBUG", "maybe"), ("FD_LOG_LEVEL", "LOUD"),
    ("FD_MODEL_SOURCE", "GITHUB"), ("FD_LOG_BACKUP_COUNT", "-1"), ("FD_CPU_NUM_THREADS", "0"),
])
def test_a_bad_value_is_named_at_start_up(clean_env, name, raw):
    clean_env.setenv(name, raw)
    envs.reset()
    with pytest.raises(ValueError, match=f"{name}.*{raw}"):
        envs.check_values()


def test_defaults(clean_env):
    assert envs.get("FD_LOG_DIR") == "log" and envs.get("FD_DEBUG") is False
    assert envs.get("FD_LOG_LEVEL") is None and envs.get("FD_MODEL_SOURCE") is None
    assert envs.get("FD_CPU_KVCACHE_SPACE") is None and envs.get("FD_SAMPLING_CLASS") == "base"
    envs.check_values()


def test_environment_snapshot_masks_secrets(clean_env):
    clean_env.setenv("FD_API_KEY", "k1,k2")
    clean_env.setenv("FD_LOG_DIR", "/tmp/x")
    clean_env.setenv("INFERENCE_MSG_QUEUE_ID", "7")
    clean_env.setenv("UNRELATED_VARIABLE", "1")
    snap = envs.environment()
    assert snap == {"FD_API_KEY": "***", "FD_LOG_DIR": "/tmp/x", "INFERENCE_MSG_QUEUE_ID": "7"}


@pytest.mark.parametrize("name,secret", [
    ("api_key", True), ("api_keys", True), ("FD_API_KEY", True), ("hf_token", True),
    ("scheduler_password", True), ("redis_password_file", True), ("client_secret", True),
    ("ENCODE_FEATURE_BOS_AK", True), ("EXPORTER_OTLP_HEADERS", True),
    ("max_num_batched_tokens", False), ("long_prefill_token_threshold", False), ("tokenizer", False),
    ("max_tokens", False), ("bad_words_token_ids", False), ("key_cache_dtype", False), ("port", False),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_mask_secrets_keeps_structure_and_unset_values():
    cfg = {"api_keys": ["a", "b"], "api_key": None, "nested": {"password": "p", "n": 3},
           "url": "http://u:p@h/x", "plain": "http://h/x"}
    assert mask_secrets(cfg) == {"api_keys": ["***", "***"], "api_key": None,
                                 "nested": {"password": "***", "n": 3}, "url": "http://***@h/x",
                                 "plain": "http://h/x"}
