"""A small text corpus for language-model tests: seeded pseudo-verse, one file per work."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("thou", "art", "the", "king", "and", "queen", "of", "night", "day", "love", "war",
         "sword", "crown", "fool", "lord", "lady")


def pseudo_verse(folder: Path, works: int = 6, lines: int = 180, vocabulary: int = 16) -> Path:
    """``works`` files of ``lines`` lines of 4-9 words drawn (seed 0) from the first
    ``vocabulary`` of :data:`WORDS`; about 6 KB a work at 180 lines."""
    rng = random.Random(0)
    words = WORDS[:vocabulary]
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(works):
        text = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9)))
                for _ in range(lines)]
        (folder / f"work{d}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return folder
