"""frugalnas's own format of a trained language model: a folder holding ``frugalnas_gpt.json``
(the :class:`~frugalnas.nn.transformer.GPTConfig` of an
:class:`~frugalnas.nn.transformer.ElasticGPT`, its layer order, and where it came from) and
``model.pt`` (its state dict, as ``torch.save`` writes it). A user who trained such a network
writes it with :func:`save_checkpoint`, or by hand: the JSON's ``config`` holds the
constructor's arguments."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from frugalnas.nn.transformer import ElasticGPT, GPTConfig
from frugalnas.ports.errors import ConfigError, one_line

#: The file naming the format, the shape and the layer order.
CONFIG_FILE = "frugalnas_gpt.json"
#: The file of the weights.
WEIGHTS_FILE = "model.pt"
FORMAT = "frugalnas-gpt"


def is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint of this format."""
    return (folder / CONFIG_FILE).is_file()


def _config(raw: Any, file: Path) -> GPTConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: 'config' must be an object of GPTConfig fields")
    fields = [f.name for f in dataclasses.fields(GPTConfig)]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{file}: unknown config field(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(fields)}")
    try:
        return GPTConfig(**raw)
    except TypeError as exc:
        raise ConfigError(f"{file}: {one_line(exc)}") from None


def read_checkpoint(folder: str | Path) -> tuple[ElasticGPT, dict[str, Any]]:
    """The network saved in ``folder`` and the ``about`` mapping saved with it (where it came
    from); a one-line :class:`ConfigError` for a folder that is not such a checkpoint."""
    folder = Path(folder).expanduser()
    file = folder / CONFIG_FILE
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {one_line(exc)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(f"{file} is not a {FORMAT} checkpoint (its 'format' must be "
                          f"{FORMAT!r})")
    model = ElasticGPT.from_config(_config(meta.get("config"), file))
    if meta.get("layer_order") is not None:
        model.set_layer_order(meta["layer_order"])
    weights = folder / WEIGHTS_FILE
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"cannot load the weights {weights} into a network of "
                          f"{file}: {one_line(exc)}") from None
    about = meta.get("about") or {}
    return model.eval(), dict(about)


def save_checkpoint(model: ElasticGPT, folder: str | Path,
                    about: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (its largest network, its layer order) to ``folder``; the weights are
    written first and the config last, each through a temporary file, so a folder with a
    config holds complete weights."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "config": dataclasses.asdict(model.config),
            "layer_order": list(model.layer_order), "about": about or {}}
    _atomic(folder / WEIGHTS_FILE, lambda f: torch.save(model.state_dict(), f))
    _atomic(folder / CONFIG_FILE,
            lambda f: f.write_bytes((json.dumps(meta, indent=2) + "\n").encode("utf-8")))
    return folder


def _atomic(target: Path, write: Any) -> None:
    part = target.with_name(target.name + ".part")
    write(part)
    os.replace(part, target)
