"""The demo's images: digits drawn from a 5x7 bitmap font, MNIST-shaped, in a folder of PNGs."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["DIGITS_MARKER", "digit_folder", "draw_digit", "ensure_digit_folder"]

# A 5x7 bitmap font of the ten digits: the demo's images are digits a person can read.
_FONT = {
    0: ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    1: ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    2: ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    3: ("11110", "00001", "00001", "01110", "00001", "00001", "11110"),
    4: ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    5: ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    6: ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    7: ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    8: ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    9: ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
}


def draw_digit(digit: int, rng: np.random.Generator) -> np.ndarray:
    """A 28x28 grey digit, white on black like MNIST: the glyph at 3x scale, shifted and
    brightened at random so that no two images are the same."""
    glyph = np.array([[c == "1" for c in row] for row in _FONT[digit]], np.uint8)
    big = np.kron(glyph, np.ones((3, 3), np.uint8)) * 255  # 21 x 15
    image = np.zeros((28, 28), np.uint8)
    dy, dx = rng.integers(0, 28 - 21 + 1), rng.integers(2, 28 - 15 - 1)
    image[dy : dy + 21, dx : dx + 15] = (big * rng.uniform(0.7, 1.0)).astype(np.uint8)
    return image


# Written into the digits folder with what drew it: a folder drawn otherwise (an older demo's
# random noise, or other settings) is drawn again instead of kept.
DIGITS_MARKER = ".recordforge-digits"
_DIGITS_VERSION = "5x7 font v1"


def _digits_stamp(per_class: int, seed: int) -> str:
    return f"{_DIGITS_VERSION}, {per_class} per class, seed {seed}\n"


def digit_folder(root: str, *, per_class: int = 10, seed: int = 0) -> int:
    """An MNIST-shaped folder of drawn digits: train/<digit>/ and test/<digit>/ PNGs."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    written = 0
    for split, count in (("train", per_class), ("test", max(1, per_class // 5))):
        for digit in range(10):
            folder = os.path.join(root, split, str(digit))
            os.makedirs(folder, exist_ok=True)
            for k in range(count):
                Image.fromarray(draw_digit(digit, rng), mode="L").save(os.path.join(folder, f"{k:05d}.png"))
                written += 1
    with open(os.path.join(root, DIGITS_MARKER), "w") as f:
        f.write(_digits_stamp(per_class, seed))
    return written


def ensure_digit_folder(root: str, *, per_class: int = 10, seed: int = 0) -> bool:
    """The demo's digits at `root`, drawn again unless the folder says it holds these very
    digits (its marker); True when they were drawn. Only the demo's own train/ and test/
    folders and marker are removed first."""
    import shutil

    marker = os.path.join(root, DIGITS_MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read() == _digits_stamp(per_class, seed):
                return False
    for name in ("train", "test", DIGITS_MARKER):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    digit_folder(root, per_class=per_class, seed=seed)
    return True
