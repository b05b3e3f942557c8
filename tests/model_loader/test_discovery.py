"""Hub ids: FD_MODEL_CACHE (FastDeploy's <dir>/<owner>/<name> layout and the hub
cache), FD_MODEL_SOURCE (Hugging Face only; other hubs refused by name)."""

from __future__ import annotations

import shutil

import pytest

from fd_core import envs
from fd_core.model_loader import resolve_model_path
from fd_core.model_loader.discovery import ModelNotFoundError


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    for name in ("FD_MODEL_SOURCE", "FD_MODEL_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    envs.reset()
    yield monkeypatch
    envs.reset()


def test_fd_model_cache_holds_models_in_fastdeploys_layout(hub_env, tmp_path, checkpoint_factory):
    cache = tmp_path / "models"
    shutil.copytree(checkpoint_factory("tiny-dense", "pytorch"), cache / "PaddlePaddle" / "ERNIE-Tiny")
    hub_env.setenv("FD_MODEL_CACHE", str(cache))
    envs.reset()
    assert resolve_model_path("PaddlePaddle/ERNIE-Tiny") == cache / "PaddlePaddle" / "ERNIE-Tiny"
    # baidu/ on Hugging Face is PaddlePaddle/ on AI Studio: the same download serves both
    assert resolve_model_path("baidu/ERNIE-Tiny") == cache / "PaddlePaddle" / "ERNIE-Tiny"
    with pytest.raises(ModelNotFoundError, match=f"FD_MODEL_CACHE {cache}.*HF_HUB_OFFLINE"):
        resolve_model_path("baidu/Other-Model")


def test_without_fd_model_cache_fastdeploys_home_download_is_found(hub_env, tmp_path, checkpoint_factory):
    home = tmp_path / "home"
    shutil.copytree(checkpoint_factory("tiny-dense", "pytorch"), home / "baidu" / "ERNIE-Tiny")
    assert resolve_model_path("baidu/ERNIE-Tiny") == home / "baidu" / "ERNIE-Tiny"
    with pytest.raises(ModelNotFoundError, match="local hub cache"):
        resolve_model_path("baidu/Other-Model")


@pytest.mark.parametrize("source", ["AISTUDIO", "modelscope"])
def test_other_model_sources_are_refused_by_name(hub_env, source, checkpoint_factory):
    hub_env.setenv("FD_MODEL_SOURCE", source)
    envs.reset()
    with pytest.raises(ValueError, match=f"FD_MODEL_SOURCE={source.upper()}.*not implemented"):
        resolve_model_path("baidu/ERNIE-4.5-0.3B-Paddle")
    local = checkpoint_factory("tiny-dense", "pytorch")
    assert resolve_model_path(str(local)) == local  # a local directory never needs a hub


def test_huggingface_source_is_the_default_and_can_be_named(hub_env):
    hub_env.setenv("FD_MODEL_SOURCE", "HUGGINGFACE")
    envs.reset()
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model_path("baidu/ERNIE-4.5-0.3B-Paddle")
