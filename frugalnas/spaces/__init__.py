"""Search spaces: NAS-Bench-201 cells (``nb201``), DAG cells (``dag``), and define-by-run
model spaces made from a user's builder function (:func:`define`)."""

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.spaces.define_by_run import define

__getattr__ = lazy_attributes(__name__, {"DefineByRunSpace": "frugalnas.spaces.define_by_run"})

__all__ = ["DefineByRunSpace", "define"]
