"""Built-in dataset ``text``: UTF-8 text files cut into blocks of tokens for language modelling.

A :class:`TextSource` reads a file, a folder (its ``*.txt`` files, sorted) or a glob; each file
is a document. The documents are split, with the seed, into training, validation and test
documents (whole documents: no document is in two splits); a single document is split by
contiguous byte ranges instead (its head trains, its tail validates and tests). Each split's
documents, in path order, make one stream of tokens:

* ``tokenizer="bytes"``: a token is a UTF-8 byte (vocabulary 256); the files are never read
  whole: a batch's blocks are read from them with ``os.pread`` (a split's whole stream,
  :meth:`TextSource.tokens`, is a numpy memory map), so a corpus of any size costs little
  memory;
* ``tokenizer="bpe"``: a byte-level BPE of ``vocab_size`` tokens trained here (the
  ``tokenizers`` package, nothing downloaded) on the training split only, saved to and reused
  from ``tokenizer_dir`` when one is given (so that a worker or an export process reads the
  same tokens); the splits' tokens are kept as one compact array each (uint16 up to 65,536
  tokens).

A stream is cut into non-overlapping blocks of ``context`` tokens (each with the token after
it, for the shifted targets): an example is a block, a batch is ``(tokens, next tokens)``,
both ``(N, context)`` int64, and the task is language modelling
(:class:`~frugalnas.ports.task.LanguageModelling`, which also gives the validation loss in
bits per byte of the validation text).
Blocks may straddle the end of one document and the start of the next in the same split.

Without ``path`` the source reads the shipped sample, nine Shakespeare plays (see
``frugalnas/datasets/samples/shakespeare/README.md`` for source and licence)."""

from __future__ import annotations

import codecs
import functools
import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugalnas.datasets.bpe import ByteRange, bpe_tokenizer, encode_ranges
from frugalnas.ports.data import (DataSource, check_fractions, epoch_order, fixed_indices,
                                  no_test_split, split_counts, split_indices, split_name,
                                  subset_indices)
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.task import LanguageModelling, Task

NAME = "text"
#: The shipped sample corpus, read when no ``path`` is given.
SAMPLE = Path(__file__).resolve().parent / "samples" / "shakespeare"
#: The tokenizers a text source offers.
TOKENIZERS = ("bytes", "bpe")
#: Bytes read at a time while checking that a file is UTF-8.
READ_CHUNK = 1 << 22
#: Tokens per evaluation batch (``eval_batches``): ``EVAL_TOKENS // context`` blocks.
EVAL_TOKENS = 8192
#: ``split`` and ``labels`` refuse a split of more tokens than this (use ``eval_batches``).
SPLIT_LIMIT = 1 << 26


# -- token streams --------------------------------------------------------------------------
class FileBytes:
    """Bytes ``[start, end)`` of a file: read a block at a time (``os.pread``) or, as a whole,
    memory-mapped (:attr:`array`). A pickled copy (a worker's) holds the file's name, never
    its bytes."""

    def __init__(self, file: Path, start: int, end: int):
        self.file, self.start, self.end = Path(file), int(start), int(end)
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def array(self) -> np.ndarray:
        """All the bytes, memory-mapped."""
        if self._array is None:
            self._array = np.memmap(self.file, dtype=np.uint8, mode="r", offset=self.start,
                                    shape=(self.end - self.start,))
        return self._array

    def read(self, offset: int, length: int, handles: dict[Path, int]) -> np.ndarray:
        """Bytes ``[offset, offset + length)`` of the range (fewer at its end), read through
        the file descriptors in ``handles`` (opened there on first use)."""
        length = max(0, min(length, len(self) - offset))
        if not hasattr(os, "pread"):  # no positioned reads (Windows): through the mapping
            return np.array(self.array[offset:offset + length])
        if self.file not in handles:
            handles[self.file] = os.open(self.file, os.O_RDONLY)
        data = os.pread(handles[self.file], length, self.start + offset)
        return np.frombuffer(data, dtype=np.uint8)

    def __getstate__(self) -> tuple[Path, int, int]:
        return self.file, self.start, self.end

    def __setstate__(self, state: tuple[Path, int, int]) -> None:
        self.file, self.start, self.end = state
        self._array = None


def _values(segment: Any) -> np.ndarray:
    return segment.array if isinstance(segment, FileBytes) else segment


@dataclass(frozen=True, eq=False)
class TokenStream:
    """Tokens of consecutive segments (ranges of files' bytes, or in-memory arrays) read as one
    sequence without joining them.

    A block of file bytes is read with ``os.pread``, not through a memory mapping: a mapped
    page-cache page counts in the process's resident memory, and a kernel may map a whole
    large folio (megabytes) for one small read, so random blocks of a mapped corpus would
    grow the RSS by up to the corpus's size."""

    segments: tuple[Any, ...]

    @property
    def ends(self) -> np.ndarray:
        return np.cumsum([len(s) for s in self.segments], dtype=np.int64)

    def __len__(self) -> int:
        return int(sum(len(s) for s in self.segments))

    def __add__(self, other: "TokenStream") -> "TokenStream":
        return TokenStream(self.segments + other.segments)

    def read(self, start: int, length: int, ends: np.ndarray | None = None,
             handles: dict[Path, int] | None = None) -> np.ndarray:
        """Tokens ``[start, start + length)`` (a copy)."""
        if handles is None:
            with _Handles() as opened:
                return self.read(start, length, ends, opened)
        ends = self.ends if ends is None else ends
        k = int(np.searchsorted(ends, start, side="right"))
        pieces, left, at = [], length, start
        while left > 0 and k < len(self.segments):
            offset = at - (int(ends[k - 1]) if k else 0)
            segment = self.segments[k]
            piece = segment.read(offset, left, handles) if isinstance(segment, FileBytes) \
                else segment[offset:offset + left]
            pieces.append(piece)
            left -= len(piece)
            at += len(piece)
            k += 1
        return np.concatenate(pieces) if len(pieces) != 1 else np.array(pieces[0])

    def rows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """``len(starts)`` rows of ``length`` tokens as int64."""
        if len(self.segments) == 1 and not isinstance(self.segments[0], FileBytes):
            return np.asarray(self.segments[0][starts[:, None] + np.arange(length)],
                              dtype=np.int64)
        ends = self.ends
        out = np.empty((len(starts), length), dtype=np.int64)
        with _Handles() as handles:
            for r, start in enumerate(starts):
                out[r] = self.read(int(start), length, ends, handles)
        return out

    def array(self) -> np.ndarray:
        """The whole stream as one array (a view of the mapping for a single segment)."""
        if len(self.segments) == 1:
            return _values(self.segments[0])
        return np.concatenate([np.asarray(_values(s)) for s in self.segments])


class _Handles(dict[Path, int]):
    """File descriptors opened for one read, closed after it."""

    def __enter__(self) -> "_Handles":
        return self

    def __exit__(self, *_: Any) -> None:
        for fd in self.values():
            os.close(fd)
        self.clear()


@dataclass(frozen=True, eq=False)
class TextSplit:
    """One split: a token stream, the start of each of its blocks, and its documents."""

    stream: TokenStream
    starts: np.ndarray
    documents: tuple[str, ...]
    n_bytes: int = 0


def block_starts(length: int, context: int) -> np.ndarray:
    """Starts of the non-overlapping blocks of ``context`` tokens (+1) of a stream."""
    return np.arange(0, max(0, length - context), context, dtype=np.int64)


# -- the source -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TextSource(DataSource):
    """Blocks of ``context`` tokens of text documents split by document (see the module's
    docstring): an example is a block, a batch ``(tokens, next tokens)`` of int64
    ``(N, context)``, ``num_classes`` the vocabulary size. Make one with :meth:`open` (or the
    registered ``text`` dataset). With a single document the splits are contiguous byte
    ranges of it: the first ``1 - valid_fraction - test_fraction`` of its bytes train, the
    next ``valid_fraction`` validate, the tail ``test_fraction`` tests (cut at character
    boundaries), whatever the seed."""

    name: str
    splits: dict[str, TextSplit]
    context: int
    num_classes: int
    tokenizer: str = "bytes"
    tokenizer_file: Path | None = None
    bpe: Any = None

    @classmethod
    def open(cls, path: str | Path | None = None, seed: int = 0, context: int = 256,
             tokenizer: str = "bytes", vocab_size: int = 1024, valid_fraction: float = 0.1,
             test_fraction: float = 0.1, tokenizer_dir: str | Path | None = None) -> "TextSource":
        """Check the options and the files (each must be non-empty UTF-8, checked in
        chunks), split the documents with ``seed``, and tokenize: bytes stay in the files; a
        BPE tokenizer is trained on the training split (or reused from ``tokenizer_dir``)."""
        check_text(path, context, tokenizer, vocab_size, valid_fraction, test_fraction,
                   tokenizer_dir)
        shown = str(SAMPLE if path is None else path)
        files = text_files(SAMPLE if path is None else path)
        for file in files:
            check_utf8(file)
        ranges = split_documents(files, shown, valid_fraction, test_fraction, seed)
        bpe, tokenizer_file = None, None
        if tokenizer == "bytes":
            streams = {which: TokenStream(tuple(FileBytes(*r) for r in rs))
                       for which, rs in ranges.items()}
            num_classes = 256
        else:
            bpe, tokenizer_file = bpe_tokenizer(ranges["train"], vocab_size, tokenizer_dir)
            num_classes = int(bpe.get_vocab_size())
            dtype = np.uint16 if num_classes <= 1 << 16 else np.int32
            streams = {which: TokenStream((encode_ranges(bpe, rs, dtype),))
                       for which, rs in ranges.items()}
        splits = {}
        for which, stream in streams.items():
            starts = block_starts(len(stream), context)
            if not len(starts):
                label = {"train": "training", "valid": "validation", "test": "test"}[which]
                raise ConfigError(
                    f"dataset {NAME!r}: the {label} split of path {shown!r} (option path) holds "
                    f"{len(stream)} tokens, too few for one block of context {context} + 1; "
                    "lower context or give more text")
            docs = tuple(dict.fromkeys(str(r[0]) for r in ranges[which]))
            n_bytes = sum(int(r[2]) - int(r[1]) for r in ranges[which])
            splits[which] = TextSplit(stream, starts, docs, n_bytes)
        return cls(NAME, splits, int(context), num_classes, tokenizer, tokenizer_file, bpe)

    # -- the contract ----------------------------------------------------------------------
    @functools.cached_property
    def task(self) -> Task:
        """Language modelling, with the validation text's bytes per token (bits per byte);
        made once per source (scoring a split asks for it every batch)."""
        valid = self.splits["valid"]
        return LanguageModelling(valid.n_bytes / len(valid.stream) if len(valid.stream) else None)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """``(context,)``: one example is a block of token ids."""
        return (self.context,)

    @property
    def has_test(self) -> bool:
        return "test" in self.splits and len(self.splits["test"].starts) > 0

    def num_examples(self, which: str) -> int:
        which = split_name(which)
        return len(self.splits[which].starts) if which in self.splits else 0

    def labels(self, which: str) -> torch.Tensor:
        """The targets (next tokens) of a split's blocks, ``(blocks, context)`` int64."""
        return self.split(which)[1]

    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of blocks of a split; the order depends only on ``(seed, epoch)``."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"invalid batch_size {batch_size!r}; expected an integer >= 1")
        part = self._part(which)
        n = len(part.starts)
        order = epoch_order(n, shuffle, seed, epoch).numpy()
        stop = n - (n % batch_size) if drop_last else n
        for start in range(0, stop, batch_size):
            yield self._blocks(part, order[start:start + batch_size])

    def fixed_batch(self, size: int, seed: int = 0,
                    which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        part = self._part(which)
        return self._blocks(part, fixed_indices(len(part.starts), size, seed).numpy())

    def head(self, which: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = self._part(which)
        return self._blocks(part, np.arange(min(int(n), len(part.starts))))

    def eval_batches(self, which: str,
                     limit: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``limit`` (default: all) blocks of a split in order, ``EVAL_TOKENS //
        context`` blocks a batch."""
        part = self._part(which)
        n = len(part.starts) if limit is None else min(int(limit), len(part.starts))
        step = max(1, EVAL_TOKENS // self.context)
        for start in range(0, n, step):
            yield self._blocks(part, np.arange(start, min(start + step, n)))

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole split's blocks and targets (small data: refused above ``SPLIT_LIMIT``
        tokens; read a large split with :meth:`eval_batches`)."""
        part = self._part(which)
        tokens = len(part.starts) * self.context
        if tokens > SPLIT_LIMIT:
            raise ConfigError(f"dataset {self.name!r}: the {split_name(which)} split holds "
                              f"{tokens} tokens, too many for one tensor (at most "
                              f"{SPLIT_LIMIT}); read it in batches (eval_batches)")
        return self._blocks(part, np.arange(len(part.starts)))

    def subset(self, fraction: float = 1.0, seed: int = 0) -> "TextSource":
        """A seeded ``fraction`` of the training blocks (kept in stream order)."""
        train = self.splits["train"]
        idx = np.sort(subset_indices(len(train.starts), fraction, seed).numpy())
        return self._with("train", replace(train, starts=train.starts[idx]))

    def train_and_valid(self) -> "TextSource":
        """Training blocks followed by the validation blocks as the training split."""
        train, valid = self.splits["train"], self.splits["valid"]
        joined = TextSplit(train.stream + valid.stream,
                           np.concatenate([train.starts, valid.starts + len(train.stream)]),
                           train.documents + valid.documents, train.n_bytes + valid.n_bytes)
        return self._with("train", joined)

    def resized(self, size: int) -> "TextSource":
        raise ConfigError(f"dataset {self.name!r}: a text source has no image size (asked for "
                          f"{size!r}); leave resize unset")

    # -- whole-split conveniences (small data, tests) ----------------------------------------
    @property
    def train_x(self) -> torch.Tensor:
        return self.split("train")[0]

    @property
    def train_y(self) -> torch.Tensor:
        return self.split("train")[1]

    @property
    def valid_x(self) -> torch.Tensor:
        return self.split("valid")[0]

    @property
    def valid_y(self) -> torch.Tensor:
        return self.split("valid")[1]

    @property
    def test_x(self) -> torch.Tensor | None:
        return self.split("test")[0] if self.has_test else None

    @property
    def test_y(self) -> torch.Tensor | None:
        return self.split("test")[1] if self.has_test else None

    # -- text ------------------------------------------------------------------------------
    def documents(self, which: str) -> tuple[str, ...]:
        """The files whose text a split holds, in stream order."""
        return self._part(which).documents

    def tokens(self, which: str) -> np.ndarray:
        """A split's whole token stream (uint8 bytes or uint16/int32 BPE ids; memory-mapped
        for the bytes of a single document, else a copy)."""
        return self._part(which).stream.array()

    def encode(self, text: str) -> np.ndarray:
        """The token ids of ``text`` (int64)."""
        if self.bpe is None:
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        return np.asarray(self.bpe.encode(text).ids, dtype=np.int64)

    def decode(self, ids: Any) -> str:
        """The text of token ids (a tensor, an array or a list)."""
        values = np.asarray(ids.tolist() if isinstance(ids, torch.Tensor) else ids).ravel()
        if self.bpe is None:
            return bytes(values.astype(np.uint8)).decode("utf-8", errors="replace")
        return str(self.bpe.decode([int(v) for v in values]))

    # -- reading ---------------------------------------------------------------------------
    def _part(self, which: str) -> TextSplit:
        which = split_name(which)
        if which == "test" and not self.has_test:
            raise no_test_split(self.name)
        return self.splits[which]

    def _with(self, which: str, part: TextSplit) -> "TextSource":
        return replace(self, splits={**self.splits, which: part})

    def _blocks(self, part: TextSplit, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = part.stream.rows(part.starts[np.asarray(idx, dtype=np.int64)], self.context + 1)
        rows_t = torch.from_numpy(rows.reshape(len(idx), self.context + 1))
        return rows_t[:, :-1].contiguous(), rows_t[:, 1:].contiguous()


# -- files ----------------------------------------------------------------------------------
def text_files(path: str | Path) -> list[Path]:
    """The documents ``path`` names: a file, a folder's ``*.txt`` files (sorted) or a glob's
    files (sorted); a one-line :class:`ConfigError` when nothing matches or a file is empty."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"invalid path {path!r} for dataset {NAME!r}; expected a file, a "
                          "folder of .txt files or a glob (-o dataset.path=PATH)")
    text = os.path.expanduser(str(path))
    root = Path(text)
    if not root.exists() and glob.has_magic(text):
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise ConfigError(f"dataset {NAME!r}: path {str(path)!r} (option path) matches "
                              "no file")
    elif not root.exists():
        raise ConfigError(f"dataset {NAME!r}: path {str(path)!r} (option path) does not exist")
    elif root.is_dir():
        files = sorted(p for p in root.glob("*.txt") if p.is_file())
        if not files:
            raise ConfigError(f"dataset {NAME!r}: path {str(path)!r} (option path) is a folder "
                              "without .txt files")
    else:
        files = [root]
    for file in files:
        if file.stat().st_size == 0:
            raise ConfigError(f"dataset {NAME!r}: file {str(file)!r} (option path "
                              f"{str(path)!r}) is empty")
    return files


def check_utf8(file: Path) -> None:
    """A one-line :class:`ConfigError` naming the file and the byte offset unless the file is
    UTF-8 (read in chunks with an incremental decoder: any size, little memory)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(file, "rb") as handle:
        while True:
            chunk = handle.read(READ_CHUNK)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise ConfigError(f"dataset {NAME!r}: file {str(file)!r} is not UTF-8 text: "
                                  f"{exc.reason} at byte offset {offset - pending + exc.start}"
                                  ) from None
            if not chunk:
                return
            offset += len(chunk)


def _char_boundary(file: Path, position: int, size: int) -> int:
    """``position`` moved forward to the start of a UTF-8 character."""
    if position <= 0 or position >= size:
        return max(0, min(position, size))
    with open(file, "rb") as handle:
        handle.seek(position)
        following = handle.read(4)
    step = 0
    while step < len(following) and following[step] & 0xC0 == 0x80:
        step += 1
    return position + step


def _check_documents(files: Sequence[Path], shown: str, valid_fraction: float,
                     test_fraction: float) -> None:
    if len(files) == 1:
        return
    n_valid, n_test = split_counts(len(files), valid_fraction, test_fraction)
    if len(files) - n_valid - n_test < 1:
        test = f", {n_test} for test" if n_test else ""
        raise ConfigError(
            f"dataset {NAME!r}: path {shown!r} (option path) holds {len(files)} documents, "
            f"fewer than a split by document needs ({n_valid} for validation{test} and 1 for "
            "training); add documents, lower valid_fraction/test_fraction or give a single "
            "file (split by byte ranges)")


def split_documents(files: Sequence[Path], shown: str, valid_fraction: float,
                    test_fraction: float, seed: int) -> dict[str, list[ByteRange]]:
    """The byte ranges of each split: whole documents chosen with a seeded permutation (its
    first documents validate, its last ones test, as ``ports.data.split_indices``; each
    split's documents in path order), or for a single document its head for training and
    its tail for validation and test."""
    if len(files) == 1:
        file = files[0]
        size = file.stat().st_size
        a = _char_boundary(file, int(round(size * (1 - valid_fraction - test_fraction))), size)
        b = _char_boundary(file, int(round(size * (1 - test_fraction))), size) if test_fraction \
            else size
        ranges = {"train": [(file, 0, a)], "valid": [(file, a, b)]}
        if test_fraction:
            ranges["test"] = [(file, b, size)]
        return ranges
    _check_documents(files, shown, valid_fraction, test_fraction)
    train, valid, test = split_indices(NAME, len(files), valid_fraction, seed, test_fraction)
    chosen = {"train": train, "valid": valid}
    if len(test):
        chosen["test"] = test
    return {which: [(files[i], 0, files[i].stat().st_size) for i in sorted(int(j) for j in idx)]
            for which, idx in chosen.items()}


# -- the registered dataset -----------------------------------------------------------------
def check_text(path: Any = None, context: Any = 256, tokenizer: Any = "bytes",
               vocab_size: Any = 1024, valid_fraction: Any = 0.1, test_fraction: Any = 0.1,
               tokenizer_dir: Any = None, **_: Any) -> None:
    """The options, and that the path names non-empty files, enough of them for a split by
    document (their text is not read)."""
    check_fractions(valid_fraction, test_fraction, NAME)
    for what, value, low in (("context", context, 1), ("vocab_size", vocab_size, 256)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"invalid {what} {value!r} for dataset {NAME!r}; expected an "
                              f"integer >= {low}")
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"invalid tokenizer {tokenizer!r} for dataset {NAME!r}; valid: "
                          f"{', '.join(repr(t) for t in TOKENIZERS)}")
    if tokenizer_dir is not None:
        if not isinstance(tokenizer_dir, (str, Path)) or not str(tokenizer_dir):
            raise ConfigError(f"invalid tokenizer_dir {tokenizer_dir!r} for dataset {NAME!r}; "
                              "expected a folder (or none)")
        if Path(tokenizer_dir).expanduser().exists() and \
                not Path(tokenizer_dir).expanduser().is_dir():
            raise ConfigError(f"dataset {NAME!r}: tokenizer_dir {str(tokenizer_dir)!r} is not "
                              "a folder")
    source = SAMPLE if path is None else path
    _check_documents(text_files(source), str(source), valid_fraction, test_fraction)


def text(path: str | None = None, seed: int = 0, context: int = 256, tokenizer: str = "bytes",
         vocab_size: int = 1024, valid_fraction: float = 0.1, test_fraction: float = 0.1,
         tokenizer_dir: str | None = None) -> TextSource:
    """UTF-8 text files (a file, a folder's *.txt files or a glob; default: a Shakespeare
    sample) split by document into blocks of ``context`` byte or BPE tokens, for language
    modelling.

    ``path``: a file, a folder's ``*.txt`` files or a glob (default: the shipped sample);
    ``tokenizer`` ``"bytes"`` or ``"bpe"`` (trained on the training split, ``vocab_size``
    tokens, saved to ``tokenizer_dir``)."""
    return TextSource.open(path, seed, context, tokenizer, vocab_size, valid_fraction,
                           test_fraction, tokenizer_dir)


text.check_options = check_text  # type: ignore[attr-defined]
