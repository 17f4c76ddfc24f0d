"""The ``text`` dataset: UTF-8 documents split by document (or by byte ranges for one
document), tokenized as bytes or a locally trained BPE, served as blocks of tokens and their
next tokens through the DataSource contract."""

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from frugalnas import ConfigError, create_component
from frugalnas.datasets.bpe import TOKENIZER_FILE
from frugalnas.datasets.text import EVAL_TOKENS, SAMPLE, TextSource, check_text
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.task import LANGUAGE_MODELLING

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def unique_words(rng, n, length=9):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, length)) for _ in range(n)]


def write_documents(root, n=10, seed=0):
    """``n`` documents, each with a word of its own repeated among common words (and a few
    characters outside ASCII); returns ``{file name: (text, its own word)}``."""
    rng = np.random.default_rng(seed)
    common = ["the", "king", "queen", "and", "of", "to", "thou", "art", "café", "naïve", "—"]
    own = unique_words(rng, n)
    root.mkdir(parents=True, exist_ok=True)
    docs = {}
    for i in range(n):
        lines = []
        for _ in range(120):
            words = list(rng.choice(common, 8)) + [own[i]] * 2
            rng.shuffle(words)
            lines.append(" ".join(words))
        text = f"Document {i} 日本\n" + "\n".join(lines) + "\n"
        (root / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
        docs[f"doc{i:02d}.txt"] = (text, own[i])
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return root, write_documents(root)


def names(ds, which):
    return [os.path.basename(d) for d in ds.documents(which)]


def test_split_by_document_is_seeded_and_disjoint(corpus):
    root, docs = corpus
    ds = TextSource.open(root, seed=0, context=32)
    parts = {w: names(ds, w) for w in ("train", "valid", "test")}
    assert [len(parts[w]) for w in ("train", "valid", "test")] == [8, 1, 1]
    assert sorted(sum(parts.values(), [])) == sorted(docs)  # disjoint, every document
    assert all(p == sorted(p) for p in parts.values())  # path order within a split
    again = TextSource.open(root, seed=0, context=32)
    assert {w: names(again, w) for w in parts} == parts
    assert any({w: names(TextSource.open(root, seed=s, context=32), w) for w in parts} != parts
               for s in (1, 2, 3))
    # bytes round-trip: a split's tokens are its documents' bytes, in order
    for which, files in parts.items():
        expected = "".join(docs[f][0] for f in files)
        tokens = ds.tokens(which)
        assert tokens.dtype == np.uint8
        assert bytes(tokens) == expected.encode("utf-8") and ds.decode(tokens) == expected
    assert ds.task.name == LANGUAGE_MODELLING.name and ds.num_classes == 256 and ds.input_shape == (32,)
    assert ds.name == "text" and ds.has_test and ds.tokenizer_file is None


def test_blocks_are_windows_of_the_stream_and_targets_shift_by_one(corpus):
    root, _ = corpus
    ctx = 40
    ds = TextSource.open(root, seed=0, context=ctx)
    for which in ("train", "valid", "test"):
        stream = ds.tokens(which).astype(np.int64)
        n = ds.num_examples(which)
        assert n == (len(stream) - 1) // ctx
        x, y = ds.split(which)
        assert x.shape == y.shape == (n, ctx) and x.dtype == y.dtype == torch.int64
        windows = np.stack([stream[i * ctx:i * ctx + ctx + 1] for i in range(n)])
        assert np.array_equal(x.numpy(), windows[:, :-1]) and np.array_equal(y.numpy(), windows[:, 1:])
        assert torch.equal(ds.labels(which), y)
        got = list(ds.eval_batches(which))
        assert len(got) == -(-n // (EVAL_TOKENS // ctx))  # in batches, not one tensor
        assert torch.equal(torch.cat([b[0] for b in got]), x)
        assert torch.equal(torch.cat([b[1] for b in got]), y)
        assert sum(len(b[0]) for b in ds.eval_batches(which, limit=7)) == 7
        hx, hy = ds.head(which, 5)
        assert torch.equal(hx, x[:5]) and torch.equal(hy, y[:5])


def test_batch_order_depends_only_on_seed_and_epoch(corpus):
    root, _ = corpus
    ds = TextSource.open(root, seed=0, context=32)
    other = TextSource.open(root, seed=0, context=32)

    def epoch(source, seed, e, **kw):
        return [(x.clone(), y.clone()) for x, y in source.batches("train", 16, seed=seed, epoch=e, **kw)]

    a = epoch(ds, 3, 0)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, epoch(other, 3, 0)))
    assert not torch.equal(a[0][0], epoch(ds, 3, 1)[0][0])
    assert not torch.equal(a[0][0], epoch(ds, 4, 0)[0][0])
    # an epoch reads every block once
    rows = sorted(r.tobytes() for x, _ in a for r in x.numpy())
    assert rows == sorted(r.tobytes() for r in ds.split("train")[0].numpy())
    n = ds.num_examples("train")
    dropped = epoch(ds, 3, 0, drop_last=True)
    assert sum(len(x) for x, _ in dropped) == n - n % 16
    plain = list(ds.batches("train", 16, shuffle=False))
    assert torch.equal(plain[0][0], ds.head("train", 16)[0])
    copy = pickle.loads(pickle.dumps(ds))  # what a worker gets: file names, not their bytes
    assert len(pickle.dumps(ds)) < 100_000
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, epoch(copy, 3, 0)))
    fx, fy = ds.fixed_batch(6, seed=2)
    assert torch.equal(fx, other.fixed_batch(6, seed=2)[0]) and fx.shape == (6, 32)
    assert torch.equal(fx[:, 1:], fy[:, :-1])


def test_derived_sources(corpus):
    root, _ = corpus
    ds = TextSource.open(root, seed=0, context=32, test_fraction=0)
    assert not ds.has_test and ds.num_examples("test") == 0
    with pytest.raises(ConfigError, match="has no test split"):
        ds.head("test", 1)
    small = ds.subset(0.25, seed=1)
    n = ds.num_examples("train")
    assert small.num_examples("train") == round(n * 0.25)
    assert small.num_examples("valid") == ds.num_examples("valid")
    train_rows = {r.tobytes() for r in ds.split("train")[0].numpy()}
    assert all(r.tobytes() in train_rows for r in small.split("train")[0].numpy())
    both = ds.train_and_valid()
    assert both.num_examples("train") == n + ds.num_examples("valid")
    bx, _ = both.split("train")
    assert torch.equal(bx[:n], ds.split("train")[0]) and torch.equal(bx[n:], ds.split("valid")[0])
    assert both.documents("train") == ds.documents("train") + ds.documents("valid")
    assert torch.equal(ds.train_x, ds.split("train")[0]) and torch.equal(ds.valid_y, ds.labels("valid"))
    assert ds.test_x is None and ds.test_y is None
    with pytest.raises(ConfigError, match="a text source has no image size"):
        ds.resized(16)


def test_the_loss_is_also_given_in_bits_per_byte_of_the_validation_text(corpus):
    root, docs = corpus
    ds = TextSource.open(root, context=16)
    assert ds.task.derived_metrics(2.0) == {"valid_bits_per_byte": pytest.approx(2.0 / np.log(2))}
    bpe = TextSource.open(root, context=16, tokenizer="bpe", vocab_size=300)
    valid_bytes = sum(len(docs[name][0].encode("utf-8")) for name in names(bpe, "valid"))
    per_token = valid_bytes / len(bpe.tokens("valid"))
    assert per_token > 1.5   # BPE merges bytes
    assert bpe.task.derived_metrics(2.0)["valid_bits_per_byte"] == \
        pytest.approx(2.0 / np.log(2) / per_token)


def test_a_single_document_is_split_by_byte_ranges(tmp_path):
    text = "".join(f"Línea {i}: ½ der Kaiser 日本語 — über alles\n" for i in range(400))
    file = tmp_path / "one.txt"
    file.write_text(text, encoding="utf-8")
    for seed in (0, 1):
        ds = TextSource.open(file, seed=seed, context=16, valid_fraction=0.2, test_fraction=0.1)
        parts = [bytes(ds.tokens(w)) for w in ("train", "valid", "test")]
        assert b"".join(parts) == text.encode("utf-8")  # contiguous: head, then the tail
        size = len(text.encode("utf-8"))
        assert abs(len(parts[1]) - 0.2 * size) <= 4 and abs(len(parts[2]) - 0.1 * size) <= 4
        assert "".join(p.decode("utf-8") for p in parts) == text  # cut between characters
        assert all(ds.documents(w) == (str(file),) for w in ("train", "valid", "test"))


def test_bpe_trains_on_the_training_split_only_and_a_worker_reuses_it(corpus, tmp_path):
    root, docs = corpus
    folder = tmp_path / "tok"
    ds = TextSource.open(root, seed=0, context=32, tokenizer="bpe", vocab_size=600,
                         tokenizer_dir=folder)
    assert ds.tokenizer_file == folder / TOKENIZER_FILE and ds.tokenizer_file.exists()
    assert 256 < ds.num_classes <= 600
    vocab = ds.bpe.get_vocab()
    for which in ("train", "valid", "test"):
        for f in names(ds, which):
            own = docs[f][1]
            assert (("Ġ" + own) in vocab) == (which == "train"), (which, own)
        tokens = ds.tokens(which)
        assert tokens.dtype == np.uint16 and int(tokens.max()) < ds.num_classes
        assert ds.decode(tokens) == "".join(docs[f][0] for f in names(ds, which))
        x, y = ds.head(which, 3)
        assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < ds.num_classes
    digest = {w: hashlib.sha256(ds.tokens(w).tobytes()).hexdigest() for w in ("train", "valid", "test")}
    copy = pickle.loads(pickle.dumps(ds))
    assert torch.equal(copy.fixed_batch(4, seed=1)[0], ds.fixed_batch(4, seed=1)[0])
    assert copy.decode(copy.encode("café of the king")) == "café of the king"
    saved = ds.tokenizer_file.stat().st_mtime_ns
    script = textwrap.dedent(f"""
        import hashlib, json
        from frugalnas.datasets.text import TextSource
        ds = TextSource.open({str(root)!r}, seed=0, context=32, tokenizer="bpe", vocab_size=600,
                             tokenizer_dir={str(folder)!r})
        print(json.dumps({{w: hashlib.sha256(ds.tokens(w).tobytes()).hexdigest()
                          for w in ("train", "valid", "test")}}))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == digest
    assert ds.tokenizer_file.stat().st_mtime_ns == saved  # read, not trained again
    with pytest.raises(ConfigError) as info:
        TextSource.open(root, tokenizer="bpe", vocab_size=700, tokenizer_dir=folder)
    assert "trained with vocab_size 600, not 700" in str(info.value)


def one_line_error(**options):
    with pytest.raises(ConfigError) as info:
        TextSource.open(**options)
    message = str(info.value)
    assert "\n" not in message and message.startswith(("dataset 'text'", "invalid"))
    return message


def test_refusals_are_one_line_and_name_the_path(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert f"file {str(empty)!r}" in one_line_error(path=empty) and "is empty" in one_line_error(path=empty)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf".encode() + "é au lait".encode("latin-1") * 3)
    message = one_line_error(path=bad)
    assert f"file {str(bad)!r} is not UTF-8 text" in message and "at byte offset 3" in message
    assert "matches no file" in one_line_error(path=str(tmp_path / "nothing*.txt"))
    assert "does not exist" in one_line_error(path=tmp_path / "missing")
    (tmp_path / "nodocs").mkdir()
    assert "without .txt files" in one_line_error(path=tmp_path / "nodocs")
    two = tmp_path / "two"
    write_documents(two, n=2)
    message = one_line_error(path=two)
    assert f"path {str(two)!r}" in message and "holds 2 documents" in message
    assert TextSource.open(two, context=8, test_fraction=0).num_examples("test") == 0
    assert "invalid tokenizer 'wordpiece' for dataset 'text'; valid: 'bytes', 'bpe'" == \
        one_line_error(path=two, tokenizer="wordpiece")
    assert "too few for one block of context 100000" in one_line_error(path=tmp_path / "two" / "doc00.txt",
                                                                       context=100000)
    # the registered check refuses the same without reading any text
    with pytest.raises(ConfigError, match="valid: 'bytes', 'bpe'"):
        check_text(tokenizer="chars")
    with pytest.raises(ConfigError, match="invalid context 0 for dataset 'text'"):
        check_text(context=0)
    with pytest.raises(ConfigError, match="invalid valid_fraction"):
        check_text(valid_fraction=1.5)


def test_the_registered_text_dataset_reads_the_shipped_sample():
    registry = PluginHost().registry("datasets")
    assert "text" in registry.names()
    options = registry.get("text").user_options()
    assert options == {"path": None, "context": 256, "tokenizer": "bytes", "vocab_size": 1024,
                       "valid_fraction": 0.1, "test_fraction": 0.1, "tokenizer_dir": None}
    registry.get("text").factory.check_options()  # the defaults: the shipped sample
    with pytest.raises(ConfigError, match="unknown option 'resize'"):
        create_component("datasets", "text", seed=0, resize=16)
    ds = create_component("datasets", "text", seed=0, context=128)
    assert isinstance(ds, TextSource) and ds.task.name == LANGUAGE_MODELLING.name
    samples = sorted(p.name for p in SAMPLE.glob("*.txt"))
    assert len(samples) >= 5 and sum(p.stat().st_size for p in SAMPLE.glob("*.txt")) <= 1_200_000
    assert (SAMPLE / "README.md").exists()
    assert sorted(os.path.basename(d) for w in ("train", "valid", "test")
                  for d in ds.documents(w)) == samples
    assert all(ds.num_examples(w) > 100 for w in ("train", "valid", "test"))
    x, y = next(ds.batches("train", 8, seed=0))
    assert x.shape == (8, 128) and torch.equal(x[:, 1:], y[:, :-1])


# ru_maxrss of a process started from pytest starts at pytest's own peak (Linux keeps the
# high-water mark across exec), which would hide the growth: the script measures in a child
# it forks itself, whose mark starts at the script's own size.
MEMORY_SCRIPT = """
import json, os, resource, sys, time
import numpy as np, torch
from frugalnas.datasets.text import TextSource

def measure():
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    ds = TextSource.open(sys.argv[1], seed=0, context=256, valid_fraction=0.05, test_fraction=0.05)
    opened = time.perf_counter() - start
    for i, (x, y) in enumerate(ds.batches("train", 64, seed=0, epoch=0)):
        assert x.shape == (64, 256) and torch.equal(x[:, 1:], y[:, :-1])
        if i == 49:
            break
    for i, (x, y) in enumerate(ds.eval_batches("valid")):
        if i == 3:
            break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"base_mb": base / 1024, "growth_mb": (peak - base) / 1024,
                      "open_s": opened, "train_blocks": ds.num_examples("train")}), flush=True)

pid = os.fork()
if pid == 0:
    code = 1
    try:
        measure()
        code = 0
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="measured in a forked process")
def test_a_1gb_corpus_is_read_in_bounded_memory(tmp_path):
    rng = np.random.default_rng(0)
    words = unique_words(rng, 5000, length=7) + ["Ærø", "naïve", "日本"]
    piece = " ".join(rng.choice(words, 1_100_000)) + "\n"
    chunk = piece.encode("utf-8")
    file = tmp_path / "big.txt"
    total = 0
    with open(file, "wb") as out:
        while total < 1 << 30:
            out.write(chunk)
            total += len(chunk)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(file)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"1 GiB corpus: peak RSS growth {result['growth_mb']:.1f} MB (from "
          f"{result['base_mb']:.0f} MB), opened in "
          f"{result['open_s']:.1f} s, {time.perf_counter() - start:.1f} s in all")
    assert abs(result["train_blocks"] - (round(total * 0.9) - 1) // 256) <= 1
    assert 100 < result["base_mb"] < 1000 and result["growth_mb"] < 500
