"""What ``frugalnas export`` offers, light to import (the command is built for every
``frugalnas --help``): the file formats and the error of an export that failed."""

from __future__ import annotations

from frugalnas.ports.errors import FrugalnasError

#: Every format ``export`` can write.
FORMATS = ("torchscript", "export", "onnx", "huggingface")
#: The formats written when none are asked for (``huggingface``, a GPT-2 folder of a language
#: model that needs the ``transformers`` package, only on request).
DEFAULT_FORMATS = ("torchscript", "export", "onnx")


class ExportError(FrugalnasError):
    """An exported file does not reproduce the trained module (or could not be written)."""
