"""Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
vectorised over NumPy uint32 arrays, and the counters dslc's keys and draws use.

docs/random.md is the specification; this module is its reference. All arithmetic on words is
modulo 2**32. One block maps a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1) to
four words. A round, with hi/lo the high and low 32 bits of a 64-bit product:

    (c0, c1, c2, c3) <- (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))

Ten rounds; after each of the first nine, the key is bumped: k0 += W0, k1 += W1.
"""
from __future__ import annotations

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57          # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85          # Weyl key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10
MASK = 0xFFFFFFFF

# Domain tags: counter word c3 of every block, so that draws, split and fold_in never share one.
DRAW, SPLIT, FOLD_IN = 0, 1, 2

Words = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def philox4x32(c0, c1, c2, c3, k0: int, k1: int) -> Words:
    """The Philox 4x32-10 block of each counter (c0..c3: Python integers, or NumPy integer
    arrays broadcast together) under key (k0, k1), as uint32 arrays. The words are held in
    64 bits (Python integers, or uint64), where the rounds' products are exact: on Python
    integers a block costs 10 µs, where NumPy's scalars took 110 (dslc train's key a step)."""
    c = (c0, c1, c2, c3)
    if not all(type(x) is int for x in c):
        c = np.broadcast_arrays(*(np.asarray(x, np.uint64) for x in c))
    c0, c1, c2, c3 = c
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return tuple(np.asarray(x, np.uint32) for x in (c0, c1, c2, c3))


def seed_key(seed: int) -> np.ndarray:
    """key(seed): the seed's low and high 32 bits, as (k0, k1)."""
    return np.array([seed & MASK, seed >> 32], np.uint32)


def block(key: np.ndarray, index, domain: int) -> Words:
    """The block for counter index + 2**96 * domain (index < 2**64, a Python integer or an
    array)."""
    if type(index) is not int:
        index = np.asarray(index, np.uint64)
    return philox4x32(index & MASK, index >> 32, 0, domain, int(key[0]), int(key[1]))


def derive(key: np.ndarray, i: int, domain: int) -> np.ndarray:
    """A new key: words 0 and 1 of the block for counter i + 2**96 * domain (i mod 2**64)."""
    w = block(key, i % 2 ** 64, domain)
    return np.array([w[0], w[1]], np.uint32)


def stream(key: np.ndarray, n: int) -> np.ndarray:
    """The first n words of a key's draw stream: word 4*b + r is word r of block b (DRAW)."""
    words = block(key, np.arange((n + 3) // 4, dtype=np.uint64), DRAW)
    return np.stack(words, axis=-1).reshape(-1)[:n]
