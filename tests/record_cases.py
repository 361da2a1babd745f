"""Serialized records the writer and stream tests write: compressible and varied."""

from __future__ import annotations

import random


def sample_records(n: int, seed: int) -> list[bytes]:
    """`n` records: words from a small vocabulary, some random bytes, varied lengths."""
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon"]
    return [
        b" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) + rng.randbytes(rng.randint(0, 20))
        for _ in range(n)
    ]
