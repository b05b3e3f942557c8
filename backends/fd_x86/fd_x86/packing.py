"""The packed layouts of fd_x86's linear kernels: ``pack_weight`` repacks a
weight from fd-core's contract layout once (``fd_x86.linear`` caches the result
on the ``QuantizedWeight``), ``wint4_words`` says when wint4 takes the word
layout. The kernels that read each layout: ``csrc/kernels.h``."""

from __future__ import annotations

import numpy as np

__all__ = ["WORD_GROUP", "pack_weight", "wint4_words"]


def wint4_words(k: int, group_size: int) -> bool:
    """Whether packed wint4 takes the word layout (8 codes per uint32 lane;
    ``csrc/kernels_avx512.cc`` ``Wint4Words``) for ``k`` inputs and
    ``group_size`` (-1: per channel): K and the group both multiples of 8.
    The kernel decides by the same rule."""
    group = k if group_size <= 0 else group_size
    return k % 8 == 0 and group % 8 == 0


# blocks per group of the int4 word layout (csrc/kernels.h kWordGroup)
WORD_GROUP = 4


def _word_groups(words: np.ndarray) -> np.ndarray:
    """Words ``[N16, K/8, 16]`` -> the kernels' order, as uint8 ``[N16, K/8, 64]``:
    blocks in groups of ``WORD_GROUP`` (the last may be short), each group
    ``[K/8][its blocks][16]``, so a work item of a group's blocks reads one
    stream (csrc/kernels.h ``word_block``)."""
    nb, k8, _ = words.shape
    full = nb - nb % WORD_GROUP
    head = words[:full].reshape(full // WORD_GROUP, WORD_GROUP, k8, 16).transpose(0, 2, 1, 3)
    out = np.concatenate([head.reshape(-1), words[full:].transpose(1, 0, 2).reshape(-1)])
    return out.view(np.uint8).reshape(nb, k8, 64)


def pack_weight(method: str, qweight: np.ndarray, scales: np.ndarray,
                group_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The contract layout -> the packed kernels' (blocks of 16 output
    channels, padded with zero weights / scales):
    wint8 int8 ``[N32, K, 32]`` (a kernel work item's two blocks side by
    side, one stream to read); w8a8 uint8 ``[N16, K4, 16, 4]`` holding
    ``w ^ 0x80`` (K padded to 4); wint4 scales ``[N16, G, 16]`` and, where
    ``wint4_words`` (the usual case), uint8 ``[N16, K/8, 64]`` in size,
    holding per block and 8 inputs 16 little-endian uint32 words, one per
    channel, each the contract's 4 bytes of those inputs, in groups of
    ``WORD_GROUP`` blocks (``_word_groups``); else uint8 ``[N16, K/2, 16]``
    (the contract's bytes). ``group_size``: wint4's (-1 per channel; None: K / G).
    ``"wint8_pairs"`` (the bf16-activation kernel's; K even): int8 ``[N32, K/2, 64]``,
    per input pair p of two blocks 64 bytes, block b's channel c at ``32 b + 2 c``
    (input 2p) and ``32 b + 2 c + 1`` (input 2p + 1); scales unchanged.
    Returns (weight, scales)."""
    n = qweight.shape[0]
    nb = -(-n // 16)
    if method == "wint8_pairs":
        k = qweight.shape[1]
        if k % 2:
            raise ValueError(f"the wint8 pairs layout needs an even K, got {k}")
        pairs = -(-n // 32)
        w = np.zeros((pairs * 32, k), np.int8)
        w[:n] = qweight.view(np.int8)
        return np.ascontiguousarray(w.reshape(pairs, 2, 16, k // 2, 2).transpose(0, 3, 1, 2, 4)).reshape(pairs, k // 2, 64), scales
    if method == "wint4":
        kh, groups = qweight.shape[1], scales.reshape(n, -1).shape[1]
        w = np.zeros((nb * 16, kh), np.uint8)
        w[:n] = qweight.view(np.uint8)
        s = np.zeros((nb * 16, groups), np.float32)
        s[:n] = scales.reshape(n, groups)
        packed_s = np.ascontiguousarray(s.reshape(nb, 16, groups).transpose(0, 2, 1))
        group = group_size if group_size is not None else (2 * kh) // groups
        if wint4_words(2 * kh, group):
            return _word_groups(w.view("<u4").reshape(nb, 16, kh // 4).transpose(0, 2, 1)), packed_s
        return np.ascontiguousarray(w.reshape(nb, 16, kh).transpose(0, 2, 1)), packed_s
    k = qweight.shape[1]
    if method == "wint8":
        pairs = -(-n // 32)
        w = np.zeros((pairs * 32, k), np.int8)
        w[:n] = qweight.view(np.int8)
        return np.ascontiguousarray(w.reshape(pairs, 32, k).transpose(0, 2, 1)), scales
    k4 = -(-k // 4)
    w = np.zeros((nb * 16, k4 * 4), np.int8)
    w[:n, :k] = qweight.view(np.int8)
    w = w.view(np.uint8) ^ np.uint8(0x80)
    return np.ascontiguousarray(w.reshape(nb, 16, k4, 4).transpose(0, 2, 1, 3)), scales
