"""The huge-page arena (fd_x86.memory): layout of its arrays, their lifetime
under paddle tensors, ``host_tensor`` and the packed weights built on it."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest
from fd_x86 import memory
from fd_x86.memory import HUGE_PAGE, HugePageArena, host_tensor

paddle = pytest.importorskip("paddle")

SMALL_CHUNK = 4 << 20  # keeps the tests' mappings small; half a chunk = 2 MiB


def _mapping(a: np.ndarray) -> Any:
    """The mmap an arena array was carved from."""
    base = a
    while not isinstance(base, memoryview):
        base = base.base
        assert base is not None, "not an arena array"
    return base.obj


def _span(a: np.ndarray) -> tuple[int, int]:
    return a.ctypes.data, a.ctypes.data + a.nbytes


def _inside(ptr: int, region: np.ndarray) -> bool:
    return region.ctypes.data <= ptr < region.ctypes.data + region.size


@pytest.fixture
def fresh_arena(monkeypatch: pytest.MonkeyPatch) -> HugePageArena:
    """host_tensor's arena, replaced by an empty one for the test."""
    arena = HugePageArena(SMALL_CHUNK)
    monkeypatch.setattr(memory, "_ARENA", arena)
    monkeypatch.delenv("FD_X86_HUGEPAGES", raising=False)
    return arena


SHAPES = [((3, 5), np.float32), ((7,), np.int8), ((), np.float32), ((0, 4), np.float32), ((2, 3, 4), np.float64),
          ((13,), np.uint8), ((5, 1), np.int64), ((1, 1000), np.float32), ((65,), np.int16), ((3,), np.bool_),
          ((100, 300), np.float32), ((1 << 18,), np.float32)]


def test_arrays_have_shape_dtype_layout_and_do_not_overlap() -> None:
    arena = HugePageArena(SMALL_CHUNK)
    arrays = []
    for _ in range(6):  # enough to fill the first chunk and open more
        for shape, dtype in SHAPES:
            a = arena.empty(shape, dtype)
            assert a.shape == shape and a.dtype == np.dtype(dtype)
            assert a.flags.c_contiguous and a.flags.writeable
            assert a.ctypes.data % 64 == 0, (shape, dtype, a.ctypes.data % 64)
            arrays.append(a)
    spans = sorted(_span(a) for a in arrays if a.nbytes)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two arena arrays overlap"
    # write a distinct value through each, then read all back (overlap shows too)
    for i, a in enumerate(arrays):
        a[...] = i % 2 if a.dtype == np.bool_ else i % 100
    for i, a in enumerate(arrays):
        assert (a == (i % 2 if a.dtype == np.bool_ else i % 100)).all()
    assert len({id(_mapping(a)) for a in arrays}) > 1  # more than one chunk was used


def test_int_shape_is_accepted() -> None:
    a = HugePageArena(SMALL_CHUNK).empty(10, np.float32)
    assert a.shape == (10,) and a.ctypes.data % 64 == 0


def test_chunks_are_huge_page_aligned() -> None:
    arena = HugePageArena(SMALL_CHUNK)
    a = arena.empty((16,), np.float32)
    assert a.ctypes.data % HUGE_PAGE == 0  # the first array starts its chunk
    assert arena._chunk is not None and arena._chunk.ctypes.data % HUGE_PAGE == 0
    assert arena._chunk.size >= SMALL_CHUNK


@pytest.mark.parametrize("nbytes", [SMALL_CHUNK // 2 + 1, SMALL_CHUNK // 2 + 64, 3 * HUGE_PAGE + 17, 2 * SMALL_CHUNK])
def test_large_arrays_get_their_own_aligned_mapping(nbytes: int) -> None:
    arena = HugePageArena(SMALL_CHUNK)
    small = arena.empty((100,), np.float32)
    chunk = arena._chunk
    used = arena._used
    big = arena.empty((nbytes,), np.uint8)
    assert big.shape == (nbytes,) and big.flags.c_contiguous
    assert big.ctypes.data % HUGE_PAGE == 0
    assert _mapping(big) is not _mapping(small)
    assert len(_mapping(big)) >= nbytes
    assert arena._chunk is chunk and arena._used == used  # the chunk was not touched
    big[...] = 7
    small[...] = 1.0
    assert (big == 7).all() and (small == 1.0).all()
    nxt = arena.empty((100,), np.float32)
    assert _mapping(nxt) is _mapping(small)  # small arrays keep filling the chunk


def test_half_a_chunk_still_comes_from_the_chunk() -> None:
    arena = HugePageArena(SMALL_CHUNK)
    a = arena.empty((SMALL_CHUNK // 2,), np.uint8)
    assert arena._chunk is not None and _inside(a.ctypes.data, arena._chunk)


def _vma_flags(address: int) -> list[str] | None:
    """VmFlags of the mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and fields[0].count("-") == 1 and ":" not in fields[0]:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                inside = lo <= address < hi
            elif inside and fields and fields[0] == "VmFlags:":
                return fields[1:]
    return None


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_mappings_are_advised_huge_pages() -> None:
    import os

    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled") or not os.path.exists("/proc/self/smaps"):
        pytest.skip("no transparent huge pages / smaps in this kernel")
    arena = HugePageArena(SMALL_CHUNK)
    small = arena.empty((1000,), np.float32)
    big = arena.empty((3 << 20,), np.uint8)
    for a in (small, big):
        flags = _vma_flags(a.ctypes.data)
        assert flags is not None and "hg" in flags, flags  # hg: MADV_HUGEPAGE


@pytest.mark.parametrize("source", [
    lambda: np.arange(37, dtype=np.float32) * 0.5,
    lambda: np.arange(60, dtype=np.int8).reshape(6, 10),
    lambda: np.arange(24, dtype=np.float64).reshape(4, 6).T,  # transposed: not C-contiguous
    lambda: np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    lambda: (np.arange(200, dtype=np.uint8) * 3)[::3],  # strided
    lambda: np.array(3.25, dtype=np.float32),
    lambda: np.zeros((0, 3), np.float32),
    lambda: np.random.default_rng(0).normal(0, 1, (700, 1000)).astype(np.float32),  # > half a chunk
], ids=["f32", "int8", "transposed", "fortran", "strided", "scalar", "empty", "large"])
def test_copy_preserves_values(source: Any) -> None:
    a = source()
    out = HugePageArena(SMALL_CHUNK).copy(a)
    assert out.shape == a.shape and out.dtype == a.dtype and out.flags.c_contiguous
    assert out.ctypes.data % 64 == 0
    np.testing.assert_array_equal(out, a)
    assert not np.shares_memory(out, a)


def test_concurrent_allocations_do_not_overlap() -> None:
    arena = HugePageArena(SMALL_CHUNK)
    got: list[list[np.ndarray]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        for j in range(300):
            a = arena.empty((int(j % 17) * 100 + 1,), np.float32)
            a[...] = i
            got[i].append(a)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = sorted(_span(a) for arrays in got for a in arrays)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    for i, arrays in enumerate(got):
        assert all((a == i).all() for a in arrays)


@pytest.mark.parametrize("nbytes", [4000, 3 << 20], ids=["in-chunk", "own-mapping"])
def test_memory_lives_as_long_as_the_paddle_tensor(nbytes: int) -> None:
    values = np.random.default_rng(nbytes).normal(0, 1, nbytes // 4).astype(np.float32)
    arena = HugePageArena(SMALL_CHUNK)
    arr = arena.copy(values)
    mapping = weakref.ref(_mapping(arr))
    tensor = paddle.utils.dlpack.from_dlpack(arr)
    assert tensor.data_ptr() == arr.ctypes.data  # no copy
    del arr, arena
    gc.collect()
    assert mapping() is not None, "the mapping was released under a live tensor"
    # churn: fresh mappings would land on a released one's addresses
    churn = [HugePageArena(SMALL_CHUNK).copy(np.full(nbytes // 4, -1.0, np.float32)) for _ in range(4)]
    np.testing.assert_array_equal(tensor.numpy(), values)
    np.testing.assert_array_equal((tensor * 2).numpy(), values * 2)
    del churn
    del tensor
    gc.collect()
    assert mapping() is None, "the mapping outlived every array and tensor over it"


def test_host_tensor_lies_in_the_arena(fresh_arena: HugePageArena) -> None:
    for dtype in (np.float32, np.int8, np.uint8, np.int64):
        a = (np.arange(3 * 257) % 100).astype(dtype).reshape(3, 257)
        if dtype == np.int64:
            a = np.ascontiguousarray(a.T).T  # not C-contiguous: copied into C order
        t = host_tensor(a)
        assert isinstance(t, paddle.Tensor) and t.place.is_cpu_place() and t.is_contiguous()
        assert list(t.shape) == [3, 257] and t.numpy().dtype == a.dtype
        np.testing.assert_array_equal(t.numpy(), a)
        assert _inside(t.data_ptr(), fresh_arena._chunk) and t.data_ptr() % 64 == 0
        a[...] = 0  # a copy: the source can change or go
        assert t.numpy().any()


def test_host_tensor_large_array_is_huge_page_aligned(fresh_arena: HugePageArena) -> None:
    a = np.random.default_rng(1).normal(0, 1, (1100, 1000)).astype(np.float32)  # ~4.4 MB > half a chunk
    t = host_tensor(a)
    assert t.data_ptr() % HUGE_PAGE == 0
    assert fresh_arena._chunk is None  # not carved from a chunk
    del a
    gc.collect()
    assert float(t.sum()) != 0.0 and t.numpy().shape == (1100, 1000)


def test_host_tensor_without_hugepages(fresh_arena: HugePageArena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_X86_HUGEPAGES", "0")
    assert not memory.enabled()
    a = np.arange(50, dtype=np.float32).reshape(5, 10).T  # not contiguous
    t = host_tensor(a)
    assert isinstance(t, paddle.Tensor) and list(t.shape) == [10, 5]
    np.testing.assert_array_equal(t.numpy(), a)
    assert fresh_arena._chunk is None and fresh_arena._used == 0  # the arena was not used
    q = host_tensor(np.arange(-5, 5, dtype=np.int8))
    np.testing.assert_array_equal(q.numpy(), np.arange(-5, 5, dtype=np.int8))


# ----------------------------------------------------------- packed weights


@pytest.mark.parametrize("method,group", [("wint8", 128), ("wint4", 128), ("wint4", -1), ("w8a8", 128)])
@pytest.mark.parametrize("hugepages", [True, False], ids=["arena", "paddle"])
def test_packed_weights_come_through_host_tensor(
    fresh_arena: HugePageArena, monkeypatch: pytest.MonkeyPatch, method: str, group: int, hugepages: bool
) -> None:
    import fd_x86.linear as linear

    from fd_core.quantization import quantize_weight

    if not hugepages:
        monkeypatch.setenv("FD_X86_HUGEPAGES", "0")
    calls = []
    real = linear.host_tensor

    def spy(a: np.ndarray) -> Any:
        calls.append(a)
        return real(a)

    monkeypatch.setattr(linear, "host_tensor", spy)
    rng = np.random.default_rng(len(method) + group)
    quant = quantize_weight(method, rng.normal(0, 0.1, (256, 200)).astype(np.float32), group)  # N not a multiple of 16
    packed = linear._packed(quant)
    assert packed is not None and len(calls) == 2
    want_w, want_s = linear.pack_weight(method, quant.qweight.numpy(), quant.scales.numpy())
    np.testing.assert_array_equal(packed[0].numpy(), want_w)
    np.testing.assert_array_equal(packed[1].numpy(), np.asarray(want_s, np.float32))
    assert packed[0].numpy().dtype == want_w.dtype
    for t in packed:
        assert t.is_contiguous()
        if hugepages:
            assert _inside(t.data_ptr(), fresh_arena._chunk)
        else:
            assert fresh_arena._chunk is None
    # cached on the weight: a second call packs nothing
    again = linear._packed(quant)
    assert again[0] is packed[0] and again[1] is packed[1] and len(calls) == 2
    # new tensors on the weight: repacked
    quant.scales = paddle.to_tensor(quant.scales.numpy() * 2)
    repacked = linear._packed(quant)
    assert len(calls) == 4 and repacked[1] is not packed[1]
    np.testing.assert_array_equal(repacked[1].numpy(), np.asarray(want_s, np.float32) * 2)


def _anon_huge_kb(start: int, stop: int) -> int:
    """AnonHugePages (kB) of the mappings of this process that overlap [start, stop)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo < stop and start < hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


def test_advise_huge_pages_keeps_a_paddle_tensor_and_advises_its_whole_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_X86_HUGEPAGES", "1")
    monkeypatch.setattr(memory, "_ADVISED", set())
    values = np.random.default_rng(0).integers(-128, 127, size=(5 * HUGE_PAGE + 12345,), dtype=np.int8)
    t = paddle.to_tensor(values)
    begin = t.data_ptr()
    start, stop = -(-begin // HUGE_PAGE) * HUGE_PAGE, (begin + values.size) // HUGE_PAGE * HUGE_PAGE
    advised, collapsed = memory.advise_huge_pages(t)
    thp_path = "/sys/kernel/mm/transparent_hugepage/enabled"
    thp = open(thp_path).read() if memory.os.path.exists(thp_path) else "[never]"
    if "[never]" not in thp:
        assert advised == stop - start  # every whole 2 MiB page inside the tensor, nothing outside
    np.testing.assert_array_equal(t.numpy(), values)  # only the page size may change, never the contents
    assert memory.advise_huge_pages(t) == (0, False)  # once per range
    if collapsed:
        assert _anon_huge_kb(start, stop) > 0, "MADV_COLLAPSE succeeded but left no huge page in the range"


def test_advise_huge_pages_is_off_with_the_arena_and_for_small_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_ADVISED", set())
    monkeypatch.setenv("FD_X86_HUGEPAGES", "0")
    assert memory.advise_huge_pages(paddle.zeros([4 * HUGE_PAGE], dtype="int8")) == (0, False)
    monkeypatch.setenv("FD_X86_HUGEPAGES", "1")
    assert memory.advise_huge_pages(paddle.zeros([1000], dtype="float32")) == (0, False)  # no whole 2 MiB page
