"""fd-gcu: Enflame GCUs through paddle-custom-gcu (custom device ``gcu``).

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the GCU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

The GCU is a paddle custom device: the framework is the ``paddlepaddle``
wheel and the device comes from the ``paddle-custom-gcu`` plugin, which paddle
loads at import. Collectives go through paddle's custom-device backend
``xccl`` (ECCL underneath). Availability is ``fd_core.backends.device_support``'s
check: no plugin installed settles it, otherwise a child process asks paddle
for its custom device types and count.
"""

from __future__ import annotations

import functools

from fd_core.backends import device_support as ds
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "gcu"
VISIBLE_DEVICES_ENV = "TOPS_VISIBLE_DEVICES"  # the TopsRider runtime's variable
PLUGIN_DISTRIBUTIONS = ("paddle-custom-gcu",)
SPEC = ds.PaddleDeviceSpec(
    noun="GCU",
    device_type=DEVICE_TYPE,
    visible_devices_envs=(VISIBLE_DEVICES_ENV,),
    install_hint=(
        "install the paddlepaddle CPU wheel plus the plugin, e.g. pip install paddle-custom-gcu "
        "-i https://www.paddlepaddle.org.cn/packages/stable/gcu/ (see fd-gcu's README)"
    ),
    driver_tool="efsmi",
    plugin_distributions=PLUGIN_DISTRIBUTIONS,
    plugin_title="Enflame plugin",
)
# Looked up per call by fd_device_availability, so tests can replace them.
_installed = ds.installed
_probe = functools.partial(ds.probe_paddle, SPEC.probe_code)  # _probe(visible values)


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="gcu",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="xccl",
        paddle_package="paddlepaddle + paddle-custom-gcu (custom device 'gcu'; see fd-gcu's README)",
        auto_priority=100,
        description="Enflame GCUs; kernels are fd-core's reference ops (not yet run on hardware)",
    )


@hookimpl
def fd_device_availability() -> Availability:
    return ds.device_availability(SPEC, installed=_installed, probe=_probe)


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return ds.custom_device_memory(DEVICE_TYPE, device_id)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a GCU.
    return Capabilities(graph_capture=False, fp8=False, bf16=True, quantization_methods=(),
                        kv_cache_dtypes=("float32", "float16", "bfloat16"))


@hookimpl
def fd_set_device(device_id: int) -> str:
    return ds.set_paddle_device(DEVICE_TYPE, device_id)
