"""The trained parent the compression tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from frugalnas.compression.checkpoint import save_checkpoint
from frugalnas.datasets.text import TextSource
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.spaces.gpt.network import gpt_init

CONTEXT = 32


def _train(model: torch.nn.Module, steps: int) -> None:
    data = TextSource.open(None, context=CONTEXT)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = data.batches("train", 16, seed=0)
    for _, (x, y) in zip(range(steps), batches):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.fixture(scope="session")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level GPT trained briefly on the shipped Shakespeare sample."""
    torch.manual_seed(0)
    model = gpt_init(ElasticGPT(256, 64, 3, 4, 16, 192, CONTEXT))
    _train(model, 40)
    return save_checkpoint(model, tmp_path_factory.mktemp("parent"),
                           {"text": {"tokenizer": "bytes"}})
