"""The one place fd_core imports paddle, with an install hint when it is missing."""

from __future__ import annotations

from types import ModuleType

__all__ = ["import_paddle"]

_INSTALL_HINT = (
    "fd-core needs a PaddlePaddle build, and none is installed. Install the one that\n"
    "matches your hardware:\n"
    "  CPU:              pip install 'fd-core[cpu]'   (paddlepaddle)\n"
    "  NVIDIA (CUDA):    pip install fd-cuda and paddlepaddle-gpu (see backends/fd_cuda/README.md)\n"
    "  Kunlunxin XPU:    pip install fd-xpu and the paddlepaddle XPU build\n"
    "  Iluvatar/DCU/GCU: the paddle custom-device plugin named in that backend's README"
)


def import_paddle() -> ModuleType:
    """Import and return paddle, or raise ImportError saying what to install."""
    try:
        import paddle
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT}\n(import error: {exc})") from exc
    return paddle
