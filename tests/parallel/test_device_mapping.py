"""Rank -> device on the device backends: each declares its visible-devices variable and
collective; rank r sets index r of what the variable lists (paddle numbers the visible
devices from 0), and a request the variable cannot meet fails by name before any start."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from fd_core.parallel.config import rank_device_id, rank_physical_device
from fd_core.parallel.driver import ParallelRunner
from fd_core.testing.process_tree import descendants

DECLARED = {  # backend -> (visible-devices variable, collective backend, paddle device type)
    "fd_cuda": ("CUDA_VISIBLE_DEVICES", "nccl", "gpu"),
    "fd_xpu": ("XPU_VISIBLE_DEVICES", "bkcl", "xpu"),
    "fd_iluvatar": ("CUDA_VISIBLE_DEVICES", "xccl", "iluvatar_gpu"),
    "fd_dcu": ("CUDA_VISIBLE_DEVICES", "nccl", "gpu"),
    "fd_gcu": ("TOPS_VISIBLE_DEVICES", "xccl", "gcu"),
}


@pytest.mark.parametrize("package", sorted(DECLARED))
def test_each_device_backend_declares_its_variable_and_collective(package):
    module = pytest.importorskip(f"{package}.backend")
    info = module.fd_device_info()
    assert (info.visible_devices_env, info.collective_backend, info.device_type) == DECLARED[package]


@pytest.mark.parametrize("package", sorted(DECLARED))
def test_ranks_take_the_listed_devices_in_order(package):
    env_name = DECLARED[package][0]
    environ = {env_name: "4,5,6,7"}
    assert [rank_device_id(env_name, environ, r, 2) for r in range(2)] == [0, 1]
    assert [rank_physical_device(env_name, environ, r, 2) for r in range(2)] == ["4", "5"]
    assert [rank_physical_device(env_name, environ, r, 4) for r in range(4)] == ["4", "5", "6", "7"]
    # unset: every device visible, rank r on device r
    assert [rank_physical_device(env_name, {}, r, 8) for r in range(8)] == [str(r) for r in range(8)]


def test_the_mission_example_xpu_0_1():
    environ = {"XPU_VISIBLE_DEVICES": "0,1"}
    assert [rank_physical_device("XPU_VISIBLE_DEVICES", environ, r, 2) for r in range(2)] == ["0", "1"]


def test_a_host_backend_shares_one_device():
    assert [rank_device_id(None, {"CUDA_VISIBLE_DEVICES": "3"}, r, 4) for r in range(4)] == [0, 0, 0, 0]
    assert rank_physical_device(None, {}, 1, 2) == "host"


@pytest.mark.parametrize("value,tp,message", [
    ("4,5", 4, r"--tensor-parallel-size 4 needs 4 devices, but XPU_VISIBLE_DEVICES=4,5 lists 2; list 4 devices"),
    ("", 2, r"XPU_VISIBLE_DEVICES='' lists no device"),
    (" , ", 2, r"XPU_VISIBLE_DEVICES=' , ' lists no device"),
    ("0,1,1", 2, r"XPU_VISIBLE_DEVICES=0,1,1 lists device 1 more than once"),
])
def test_impossible_requests_are_refused_by_name(value, tp, message):
    with pytest.raises(ValueError, match=message):
        rank_device_id("XPU_VISIBLE_DEVICES", {"XPU_VISIBLE_DEVICES": value}, 0, tp)


def test_too_few_devices_fail_before_any_worker_starts(checkpoint_factory, monkeypatch):
    model = checkpoint_factory("tiny-dense", "pytorch")
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "6")
    backend = SimpleNamespace(name="xpu", info=SimpleNamespace(visible_devices_env="XPU_VISIBLE_DEVICES",
                                                               collective_backend="bkcl"))
    before = set(descendants(os.getpid()))
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2 needs 2 devices, but XPU_VISIBLE_DEVICES=6 "
                                         r"lists 1"):
        ParallelRunner(object, model, backend, 2)  # type: ignore[arg-type]
    assert set(descendants(os.getpid())) <= before
