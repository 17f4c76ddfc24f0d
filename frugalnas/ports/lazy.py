"""Public names of a package imported on first use (PEP 562), so that a plugin's package can
register its components and re-export its classes without importing their modules (nor
torch, scikit-learn, MLflow...) until someone uses one."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(module: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` (its ``__name__``): each name of ``exports``
    (name -> the module that defines it) is imported when first read, then kept in the
    module like an ordinary attribute; any other name is an ``AttributeError``.

    Usage: ``__getattr__ = lazy_attributes(__name__, {"NB201Space": "frugalnas.spaces.nb201.space"})``.
    """
    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__


def load_reference(target: str) -> Any:
    """The object ``"package.module:attribute"`` names (the attribute may be dotted), its
    module imported here; ImportError or AttributeError when it cannot be found."""
    module, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found
