"""Search spaces: NAS-Bench-201 cells (``nb201``), DAG cells (``dag``), and define-by-run
model spaces made from a user's builder function (:func:`define`)."""

from frugalnas.spaces.define_by_run import DefineByRunSpace, define

__all__ = ["DefineByRunSpace", "define"]
