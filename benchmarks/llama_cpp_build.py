"""Find or build llama.cpp from the llama-cpp-python sdist, and make GGUF files.

Used by ``benchmarks/llama_cpp.py``; never by CI or the default tests. The
sdist on PyPI vendors a full llama.cpp tree (``vendor/llama.cpp``: CMake
project, ``convert_hf_to_gguf.py`` with its ``conversion/`` package and
``gguf-py``), so one ``pip download`` gives the tools and the converter of
the same commit. The build (Release, ``GGML_NATIVE=ON``, no network: curl,
OpenSSL and the web UI off) makes only the four tools the benchmark runs;
it takes ~10 minutes on 2 cores and is reused from the cache afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_CACHE", "DEFAULT_VERSION", "TOOLS", "LlamaCpp", "convert", "find_or_build", "quantize",
           "shared_expert_width"]

DEFAULT_VERSION = "0.3.36"
DEFAULT_CACHE = Path.home() / ".cache" / "fd_core" / "llama.cpp"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-quantize", "llama-server")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# the converter's key for the shared experts' total width (see shared_expert_width)
SHEXP_KEY = "ernie4_5-moe.expert_shared_feed_forward_length"


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp source tree (converter, gguf-py) and the directory of its built tools."""

    source: Path  # holds convert_hf_to_gguf.py and gguf-py/
    bin_dir: Path  # holds TOOLS
    origin: str  # how it was found, for the report: "llama-cpp-python 0.3.36 sdist (cached)", ...

    def tool(self, name: str) -> Path:
        return self.bin_dir / name

    def python_env(self) -> dict[str, str]:
        """The environment for the converter scripts: its own gguf-py first on PYTHONPATH."""
        import os

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.source / "gguf-py"), env.get("PYTHONPATH")]))
        return env

    def commit(self) -> str:
        """The vendored llama.cpp commit, when the sdist recorded it."""
        for head in self.source.parents[1].glob(".git/modules/vendor/llama.cpp/HEAD"):
            return head.read_text().strip()[:12]
        return "unknown"


def _bin_dir(source: Path) -> Path | None:
    for candidate in (source / "build" / "bin", source / "bin", source):
        if all((candidate / t).is_file() for t in TOOLS):
            return candidate
    return None


def _existing(path: Path) -> LlamaCpp:
    """``--llama-cpp DIR``: a llama.cpp checkout (with build/bin) or its build directory."""
    path = path.expanduser().resolve()
    sources = [p for p in (path, path.parent, path.parent.parent) if (p / "convert_hf_to_gguf.py").is_file()]
    if not sources:
        raise FileNotFoundError(f"--llama-cpp {path}: no convert_hf_to_gguf.py in it or its two parents; "
                                "expected a llama.cpp source tree or its build directory")
    bin_dir = _bin_dir(path) or _bin_dir(sources[0])
    if bin_dir is None:
        raise FileNotFoundError(f"--llama-cpp {path}: the tools {', '.join(TOOLS)} are not all in "
                                f"{path}, {path}/build/bin or {sources[0]}/build/bin; build them first")
    return LlamaCpp(sources[0], bin_dir, f"--llama-cpp {path}")


def _download(cache: Path, version: str) -> Path:
    """The sdist tarball in ``cache`` (pip download when absent); falls back to PyPI's newest."""
    found = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(cache)]
    for spec in (f"llama-cpp-python=={version}", "llama-cpp-python"):
        print(f"pip download {spec} (sdist) into {cache}", flush=True)
        if subprocess.run([*base, spec]).returncode == 0:
            found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
            if found:
                return found[-1]
        print(f"  {spec} is not available; trying PyPI's newest", flush=True)
    raise RuntimeError(f"pip download of the llama-cpp-python sdist into {cache} failed (network or index?); "
                       "pass --llama-cpp DIR to use an existing llama.cpp build")


def _unpack(tarball: Path) -> Path:
    root = tarball.parent / tarball.name.removesuffix(".tar.gz")
    source = root / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        print(f"unpacking {tarball.name}", flush=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(tarball.parent, filter="data")
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise RuntimeError(f"{tarball} has no vendor/llama.cpp/convert_hf_to_gguf.py; this sdist does not vendor "
                           "llama.cpp as expected; pass --llama-cpp DIR")
    return source


def _build(source: Path, jobs: int) -> Path:
    build = source / "build"
    print(f"building llama.cpp in {build} ({', '.join(TOOLS)}; ~10 min on 2 cores)", flush=True)
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(jobs), "--target", *TOOLS], check=True)
    bin_dir = _bin_dir(source)
    if bin_dir is None:
        raise RuntimeError(f"the llama.cpp build in {build} finished without {', '.join(TOOLS)} in build/bin")
    return bin_dir


def find_or_build(cache: Path = DEFAULT_CACHE, llama_cpp: Path | None = None, version: str = DEFAULT_VERSION,
                  jobs: int = 2) -> LlamaCpp:
    """``llama_cpp`` when given, else the cached sdist build (downloaded and built when missing)."""
    if llama_cpp is not None:
        return _existing(llama_cpp)
    tarball = _download(cache, version)
    source = _unpack(tarball)
    label = tarball.name.removesuffix(".tar.gz").replace("llama_cpp_python-", "llama-cpp-python ")
    bin_dir = _bin_dir(source)
    if bin_dir is not None:
        return LlamaCpp(source, bin_dir, f"{label} sdist (cached build)")
    return LlamaCpp(source, _build(source, jobs), f"{label} sdist (built now)")


def shared_expert_width(config: dict[str, object]) -> int | None:
    """The shared experts' total width of an ERNIE 4.5 MoE config (None: no shared experts).

    The converter writes ``intermediate_size // num_key_value_heads``, which
    is right for ERNIE-4.5-21B-A3B (12288 // 4 = 3072 = 2 x 1536) and wrong
    for other shapes; llama.cpp then refuses the file (tensor shape
    mismatch). The tensors are ``moe_intermediate_size x
    moe_num_shared_experts`` wide, as fd-core and transformers read them.
    """
    shared = int(config.get("moe_num_shared_experts") or 0)  # type: ignore[call-overload]
    if shared <= 0 or "moe_intermediate_size" not in config:
        return None
    return shared * int(config["moe_intermediate_size"])  # type: ignore[call-overload]


def _run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name} failed "
                           f"(exit {done.returncode}); log {log}:\n{tail}")


def convert(llama: LlamaCpp, checkpoint: Path, out: Path, outtype: str = "f32") -> Path:
    """``checkpoint`` (PyTorch naming) -> ``out`` GGUF with llama.cpp's own converter; reused when present."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    print(f"converting {checkpoint.name} -> {out.name}", flush=True)
    _run_logged([sys.executable, str(llama.source / "convert_hf_to_gguf.py"), str(checkpoint), "--outtype", outtype,
                 "--outfile", str(partial)], out.with_suffix(".convert.log"), llama.python_env())
    width = shared_expert_width(json.loads((checkpoint / "config.json").read_text()))
    if width is not None:
        _run_logged([sys.executable, str(llama.source / "gguf-py" / "gguf" / "scripts" / "gguf_set_metadata.py"),
                     str(partial), SHEXP_KEY, str(width), "--force"], out.with_suffix(".metadata.log"),
                    llama.python_env())
    partial.rename(out)
    return out


def quantize(llama: LlamaCpp, source: Path, qtype: str, threads: int) -> Path:
    """``llama-quantize`` ``source`` (f32 GGUF) to ``qtype`` (q8_0, q4_0, ...) with its default recipe."""
    out = source.with_name(source.name.replace("-f32.gguf", f"-{qtype}.gguf"))
    if out.is_file():
        return out
    print(f"llama-quantize {source.name} -> {out.name}", flush=True)
    partial = out.with_suffix(".partial")
    _run_logged([str(llama.tool("llama-quantize")), str(source), str(partial), qtype.upper(), str(threads)],
                out.with_suffix(".quantize.log"))
    partial.rename(out)
    return out
