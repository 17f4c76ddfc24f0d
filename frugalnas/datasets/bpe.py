"""The byte-level BPE of the ``text`` dataset: trained on the training split's text with the
``tokenizers`` package (nothing downloaded), saved to and reused from a folder, and applied to
byte ranges of files read in pieces (a corpus is never read whole)."""

from __future__ import annotations

import codecs
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frugalnas.ports.errors import ConfigError, one_line

#: The dataset whose tokenizer this is, as its errors name it.
DATASET = "text"
#: The tokenizer's file in ``tokenizer_dir`` (``tokenizers``' own format).
TOKENIZER_FILE = "tokenizer.json"
#: The options the tokenizer in ``tokenizer_dir`` was trained with.
TOKENIZER_OPTIONS = "frugalnas-text.json"
#: Bytes of text handed to the tokenizer at a time.
TEXT_CHUNK = 1 << 20

#: One document's share of a split: ``(file, first byte, end byte)``.
ByteRange = tuple[Path, int, int]


def text_chunks(file: Path, start: int, end: int) -> Iterator[str]:
    """The text of bytes ``[start, end)`` of a file in pieces of about ``TEXT_CHUNK`` bytes,
    each cut after a line end where there is one."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry = ""
    with open(file, "rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0:
            data = handle.read(min(TEXT_CHUNK, left))
            if not data:
                break
            left -= len(data)
            text = carry + decoder.decode(data, final=left <= 0)
            cut = text.rfind("\n") + 1 or len(text)
            if text[:cut]:
                yield text[:cut]
            carry = text[cut:]
    if carry:
        yield carry


def train_bpe(ranges: Sequence[ByteRange], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens trained on the text of
    ``ranges`` (the training split)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator((chunk for r in ranges for chunk in text_chunks(*r)), trainer=trainer)
    return bpe


def _write_atomically(file: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def bpe_tokenizer(ranges: Sequence[ByteRange], vocab_size: int,
                  tokenizer_dir: str | Path | None) -> tuple[Any, Path | None]:
    """The BPE tokenizer and the file it is saved in: read from ``tokenizer_dir`` when that
    holds one (trained with the same ``vocab_size``), else trained on ``ranges`` and saved
    there (``None``: kept in memory only)."""
    from tokenizers import Tokenizer

    if tokenizer_dir is None:
        return train_bpe(ranges, vocab_size), None
    folder = Path(tokenizer_dir).expanduser()
    file, options = folder / TOKENIZER_FILE, folder / TOKENIZER_OPTIONS
    if file.exists():
        try:
            recorded = json.loads(options.read_text()).get("vocab_size") if options.exists() \
                else vocab_size
            bpe = Tokenizer.from_file(str(file))
        except Exception as exc:
            raise ConfigError(f"dataset {DATASET!r}: cannot read the tokenizer {str(file)!r} "
                              f"(option tokenizer_dir): {one_line(exc)}") from None
        if recorded != vocab_size:
            raise ConfigError(f"dataset {DATASET!r}: tokenizer_dir {str(folder)!r} holds a "
                              f"tokenizer trained with vocab_size {recorded!r}, not "
                              f"{vocab_size!r}; remove it or give another tokenizer_dir")
        return bpe, file
    bpe = train_bpe(ranges, vocab_size)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(options, json.dumps({"vocab_size": vocab_size}))
        _write_atomically(file, bpe.to_str())
    except OSError as exc:
        raise ConfigError(f"dataset {DATASET!r}: cannot save the tokenizer in tokenizer_dir "
                          f"{str(folder)!r}: {one_line(exc)}") from None
    return bpe, file


def encode_ranges(bpe: Any, ranges: Sequence[ByteRange], dtype: Any) -> np.ndarray:
    """The BPE ids of the text of ``ranges``, one compact array."""
    encode = getattr(bpe, "encode_batch_fast", bpe.encode_batch)
    parts: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        parts.extend(np.asarray(e.ids, dtype=dtype) for e in encode(batch))
        batch.clear()

    for r in ranges:
        for chunk in text_chunks(*r):
            batch.append(chunk)
            if len(batch) >= 8:
                flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
