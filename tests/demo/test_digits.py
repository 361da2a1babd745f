"""The demo's digit images: drawn from the font, and drawn again when the folder is stale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from demo.digits import _FONT, DIGITS_MARKER, draw_digit, ensure_digit_folder


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_digits_are_the_font_glyphs() -> None:
    """Each image is its digit's glyph at 3x scale somewhere in the 28x28 frame, nothing else."""
    rng = np.random.default_rng(0)
    for digit, rows in _FONT.items():
        image = draw_digit(digit, rng)
        glyph = np.kron(np.array([[c == "1" for c in row] for row in rows]), np.ones((3, 3), bool))
        placed = []
        for dy in range(28 - 21 + 1):
            for dx in range(28 - 15 + 1):
                want = np.zeros((28, 28), bool)
                want[dy : dy + 21, dx : dx + 15] = glyph
                placed.append(((image > 0) == want).all())
        assert any(placed), digit


def test_a_stale_digit_folder_is_drawn_again(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    assert ensure_digit_folder(str(fresh), per_class=3)
    want = _files(fresh)
    assert len(want) == 10 * 3 + 10 * 1 and (fresh / DIGITS_MARKER).exists()
    assert not ensure_digit_folder(str(fresh), per_class=3)  # up to date: kept as is

    # An older demo's folder: noise images and no marker, beside a file of the user's.
    old = tmp_path / "old"
    (old / "train" / "0").mkdir(parents=True)
    noise = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    Image.fromarray(noise, mode="L").save(old / "train" / "0" / "00099.png")
    (old / "notes.txt").write_text("mine")
    assert ensure_digit_folder(str(old), per_class=3)
    assert _files(old) == want and (old / "notes.txt").read_text() == "mine"
    # Other settings than the folder was drawn with: drawn again.
    assert ensure_digit_folder(str(old), per_class=2)
    assert len(_files(old)) == 10 * 2 + 10 * 1
