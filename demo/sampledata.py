"""Deterministic sample data for the demo, the tests and the benchmarks (no binaries are committed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["mnist_folder", "taxi_table"]

_VENDORS = ["CMT", "VTS", "DDS", ""]  # "" is a real value, not a missing one
_ZONES = ["Midtown", "JFK Airport", "Upper East Side", "Astoria", "Brooklyn Heights"]
_TAGS = ["night", "airport", "cash", "shared", "long"]


def taxi_table(num_rows: int, *, seed: int = 0, first_id: int = 0) -> pa.Table:
    """A small taxi-trips table exercising every type the demo schema maps."""
    rng = np.random.default_rng(seed)
    n = num_rows

    def nulls(p: float) -> np.ndarray:
        return rng.random(n) < p

    payment = np.array(["card", "cash", "dispute"])[rng.integers(0, 3, n)].astype(object)
    payment[nulls(0.05)] = None
    tip = rng.gamma(2.0, 1.5, n).astype(np.float32)
    tags = [list(rng.choice(_TAGS, size=int(k), replace=False)) for k in rng.integers(0, 4, n)]
    return pa.table(
        {
            "trip_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "vendor": pa.array(np.array(_VENDORS, dtype=object)[rng.integers(0, 4, n)], pa.string()),
            "pickup_epoch_s": pa.array(1_700_000_000 + rng.integers(0, 86_400 * 30, n)),
            "passenger_count": pa.array(rng.integers(0, 6, n)),  # 0 passengers is a value
            "trip_distance": pa.array(np.round(rng.exponential(3.0, n), 3)),  # float64
            "fare_amount": pa.array(np.round(2.5 + rng.exponential(12.0, n), 2)),  # float64
            "tip_amount": pa.array(tip, mask=nulls(0.1)),
            "payment_type": pa.array(list(payment), pa.string()),
            "store_and_fwd": pa.array(rng.random(n) < 0.02),
            "Pickup Zone": pa.array(np.array(_ZONES, dtype=object)[rng.integers(0, 5, n)], pa.string()),
            "tags": pa.array(tags, pa.list_(pa.string())),
            "pickup_lat_lon": pa.array(
                list(
                    np.stack([40.6 + rng.random(n) * 0.3, -74.05 + rng.random(n) * 0.3], 1).astype(np.float32)
                ),
                pa.list_(pa.float32(), 2),
            ),
        }
    )


def mnist_folder(root: str, *, per_class: int = 20, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """An MNIST-shaped folder: 28x28 grayscale PNGs under train/<digit>/ and test/<digit>/.
    Returns (path, pixels) for every image written, for tests to compare against."""
    import os

    from PIL import Image

    rng = np.random.default_rng(seed)
    written = []
    for split, count in (("train", per_class), ("test", max(1, per_class // 5))):
        for digit in range(10):
            folder = os.path.join(root, split, str(digit))
            os.makedirs(folder, exist_ok=True)
            for k in range(count):
                pixels = (rng.random((28, 28)) * 255 * (rng.random((28, 28)) < 0.3)).astype(np.uint8)
                path = os.path.join(folder, f"{k:05d}.png")
                Image.fromarray(pixels, mode="L").save(path)
                written.append((path, pixels))
    return written
