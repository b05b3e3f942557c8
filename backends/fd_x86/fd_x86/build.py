"""Build the C++ ops on first use and cache them.

The library is compiled once per (sources, paddle version, python) into
``~/.cache/fd_x86/<key>/`` (``$XDG_CACHE_HOME`` honoured) with
``paddle.utils.cpp_extension.load``; later processes load the cached
``.so`` without compiling. A file lock keeps concurrent processes (workers)
from building the same key twice. Building takes ~20-40 s and needs a C++
compiler; without one, ``BuildError`` says so. Prebuild with
``python -m fd_x86.build``.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
from importlib import metadata
from pathlib import Path
from types import ModuleType

__all__ = ["BuildError", "build_dir", "compiler", "is_built", "load_ops"]

logger = logging.getLogger(__name__)

NAME = "fd_x86_ops"
CSRC = Path(__file__).parent / "csrc"
SOURCES = ("x86_linear_op.cc", "kernels_avx512.cc", "kernels_avx2.cc", "x86_ops.cc", "kernels_ops.cc",
           "kernels_attn_avx512.cc", "kernels_amx.cc", "kernels_cpu.cc", "kernels_dense16.cc",
           "kernels_dense16_gemm.cc",
           "x86_moe_op.cc", "kernels_moe_avx512.cc", "kernels_amx_bf16.cc",
           "shm_comm.cc", "x86_moe_layer_op.cc", "kernels_prefill_avx512.cc",
           "x86_bitmask_op.cc", "x86_fp8_op.cc", "kernels_fp8_avx512.cc", "kernels_fp8_bf16.cc",
           "x86_vision_op.cc", "kernels_vision_avx512.cc",
           "x86_offline_op.cc", "kernels_offline_avx512.cc", "kernels_w4a8_avx512.cc",
           "kernels_int4_bf16.cc", "kernels_int8_bf16.cc", "kernels_int8_bf16_vbmi.cc", "x86_sample_op.cc")
HEADERS = ("kernels.h", "tiling.h", "amx_tiles.h", "ops_kernels.h", "packed_linear.h", "moe_kernels.h", "cpu_features.h",
           "moe_op.h", "prefill_kernels.h", "fp8_kernels.h", "vision_kernels.h", "simd_exp.h",
           "offline_kernels.h", "offline_op.h", "packed_drive.h", "dense16_common.h", "sample_kernels.h", "sample_op.h")
# No -march=native: each kernel TU targets its ISA with #pragma GCC target
# and the op dispatches at run time, so the cached .so runs on any x86-64.
CXXFLAGS = ["-O3", "-std=c++17", "-fopenmp", "-Wall", "-Wno-unused-function"]

_lock = threading.Lock()


class BuildError(RuntimeError):
    """The ops could not be compiled or loaded here."""


def compiler() -> str | None:
    """The C++ compiler setuptools will use, or None."""
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _paddle_version() -> str:
    for dist in ("paddlepaddle", "paddlepaddle-gpu"):
        try:
            return f"{dist}-{metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "paddle-unknown"


@functools.lru_cache(maxsize=1)
def ldflags() -> list[str]:
    """Link the OpenMP runtime paddle's CPU wheel ships (libiomp5, which also
    implements libgomp's ABI) when there is one: one thread pool for paddle's
    ops and ours. With libgomp beside it, each runtime's idle threads spin
    while the other's work, which made a decode step several times slower
    on 2 cores (bench_linear.py). Otherwise plain -fopenmp (libgomp)."""
    spec = importlib.util.find_spec("paddle")
    for location in (spec.submodule_search_locations or []) if spec else []:
        libs = Path(location) / "libs"
        if (libs / "libiomp5.so").exists():
            return [f"-L{libs}", "-liomp5", f"-Wl,-rpath,{libs}"]
    return ["-fopenmp"]


@functools.lru_cache(maxsize=1)
def build_dir() -> Path:
    """``<cache>/fd_x86/<hash of sources, flags, paddle, python>``."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode())
        digest.update((CSRC / name).read_bytes())
    digest.update(" ".join(CXXFLAGS + ldflags()).encode())
    digest.update(f"{_paddle_version()} {sys.version_info[:2]}".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fd_x86" / digest.hexdigest()[:16]


def _library() -> Path:
    return build_dir() / NAME / f"{NAME}.so"


def _done_marker() -> Path:
    return build_dir() / "build.done"


def is_built() -> bool:
    """True once a build finished. The marker, not the ``.so``, decides: a
    library that another process is still linking already exists, half
    written (seen as "file too short" under pytest-xdist)."""
    return _done_marker().exists() and _library().exists()


def _import_cached(directory: Path) -> ModuleType:
    from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

    return _import_module_from_library(NAME, str(directory))  # type: ignore[no-any-return]


def _compile(directory: Path) -> ModuleType:
    from paddle.utils.cpp_extension import load

    logger.info("fd_x86: compiling the x86 kernels into %s (once; ~20-40 s)", directory)
    return load(  # type: ignore[no-any-return]
        name=NAME,
        sources=[str(CSRC / name) for name in SOURCES],
        extra_cxx_cflags=list(CXXFLAGS),
        extra_ldflags=ldflags(),
        build_directory=str(directory),
        verbose=False,
    )


@functools.lru_cache(maxsize=1)
def _load() -> ModuleType:
    directory = build_dir()
    if is_built():
        return _import_cached(directory / NAME)
    if compiler() is None:
        raise BuildError(
            "fd_x86's kernels are not built yet and no C++ compiler was found (c++ / g++ on PATH, "
            "or $CXX); install one (e.g. apt-get install g++) or use --backend cpu"
        )
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building this key
        try:
            if is_built():
                return _import_cached(directory / NAME)
            # no marker: nothing here is trusted (an interrupted build leaves
            # a partial library that paddle's loader would take as current)
            shutil.rmtree(directory / NAME, ignore_errors=True)
            module = _compile(directory)
            _done_marker().write_text(str(_library()))
            return module
        except Exception as exc:
            raise BuildError(
                f"building fd_x86's kernels in {directory} failed: {type(exc).__name__}: {exc}; "
                "the compiler's messages are above; fix the toolchain or use --backend cpu"
            ) from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_ops() -> ModuleType:
    """The module with the ops (``fd_x86_*_linear``, and the decode ops of
    ``csrc/x86_ops.cc``); built on first use."""
    with _lock:
        return _load()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    load_ops()
    print(f"fd_x86 ops ready: {_library()}")
