"""The surrogate contract (scikit-learn's conventions), checked: every registered surrogate
must pass :func:`check_surrogate`. It is part of the conformance suite
:mod:`frugalnas.testing` (``frugalnas.testing.check_surrogate`` raises a ``ConformanceError``
that is also a :class:`SurrogateCheckError`)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from frugalnas.host.plugins import PluginHost
from frugalnas.ports.errors import FrugalnasError
from frugalnas.surrogates.quality import rank_quality


class SurrogateCheckError(FrugalnasError, AssertionError):
    """A surrogate broke the contract; the message names the surrogate and the check
    (``check``), and says how (``detail``)."""

    def __init__(self, message: str, check: str = "", detail: str = ""):
        super().__init__(message)
        self.check, self.detail = check, detail


def _resolve(surrogate: Any, host: Any = None) -> tuple[str, Any]:
    if isinstance(surrogate, str):
        if host is None:
            host = PluginHost()  # a fresh host of the installed plugins, not a shared one
        return surrogate, host.create("surrogates", surrogate)
    if inspect.isclass(surrogate) or (callable(surrogate) and not hasattr(surrogate, "fit")):
        return getattr(surrogate, "__name__", repr(surrogate)), surrogate()
    return type(surrogate).__name__, surrogate


def _data(seed: int, n: int, d: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 2, size=(n, d)).astype(float)
    w = np.linspace(1.0, -0.5, d)
    y = X @ w + 0.5 * X[:, 0] * X[:, 1] + 0.05 * rng.standard_normal(n)
    return X, y


def check_surrogate(surrogate: Any, host: Any = None) -> None:
    """Raise :class:`SurrogateCheckError` unless ``surrogate`` (an instance, a class or factory
    called without arguments, or a name registered in ``host``, default: a host of the installed plugins)
    follows the contract: parameters stored unchanged by ``__init__``
    (``get_params``/``clone`` round-trip), a clear error on
    ``predict`` before ``fit``, ``fit`` returning ``self``, ``predict`` returning finite
    ``(mean, std)`` of shape (n,) with ``std >= 0``, identical results for identical seeds and
    data, and predictions that rank held-out samples better than chance."""
    from sklearn.base import clone

    name, est = _resolve(surrogate, host)

    def fail(check: str, detail: str) -> None:
        raise SurrogateCheckError(f"surrogate {name!r} fails check {check!r}: {detail}", check,
                                  detail)

    for method in ("fit", "predict", "get_params"):
        if not callable(getattr(est, method, None)):
            fail("api", f"has no {method}() method")
    try:
        init_params = [p for p in inspect.signature(type(est).__init__).parameters if p != "self"]
    except (TypeError, ValueError):
        init_params = []
    params = est.get_params()
    if sorted(params) != sorted(init_params):
        fail("params-in-init", f"get_params() keys {sorted(params)} differ from __init__ "
             f"parameters {sorted(init_params)}")
    try:
        twin = clone(est)
    except Exception as exc:
        fail("clone", f"sklearn.base.clone failed: {type(exc).__name__}: {exc}")
    if twin.get_params() != params:
        fail("clone", "clone has different parameters")

    X, y = _data(0, 80)
    Xt, yt = _data(1, 40)
    try:
        est.predict(Xt)
    except Exception as exc:
        if "fit" not in str(exc).lower():
            fail("predict-before-fit", f"raised {type(exc).__name__} without saying to call "
                 f"fit: {exc}")
    else:
        fail("predict-before-fit", "predict() before fit() did not raise")

    if est.fit(X, y) is not est:
        fail("fit-returns-self", "fit() must return self")
    if est.get_params() != params:
        fail("params-in-init", "fit() changed the constructor parameters")
    out = est.predict(Xt)
    if not (isinstance(out, tuple) and len(out) == 2):
        fail("predict-output", f"predict() must return (mean, std), got {type(out).__name__}")
    mean, std = (np.asarray(o) for o in out)
    for label, arr in (("mean", mean), ("std", std)):
        if arr.shape != (len(Xt),):
            fail("predict-shape", f"{label} has shape {arr.shape}, expected ({len(Xt)},)")
        if not np.all(np.isfinite(arr)):
            fail("predict-finite", f"{label} has non-finite values")
    if np.any(std < 0):
        fail("std-non-negative", f"std has negative values (min {std.min():.3g})")
    one = est.predict(Xt[:1])
    if np.asarray(one[0]).shape != (1,):
        fail("predict-shape", "predict() on one row must return arrays of shape (1,)")

    m2, s2 = twin.fit(X, y).predict(Xt)
    if not (np.allclose(mean, m2, rtol=1e-6, atol=1e-9) and np.allclose(std, s2, rtol=1e-6, atol=1e-9)):
        fail("deterministic", "two fits with the same parameters and data predict differently")

    tau = rank_quality(yt, mean)["kendall_tau"]
    if tau < 0.3:
        fail("learns", f"Kendall tau on held-out samples is {tau:.3f} (< 0.3) on an easy "
             "linear problem")
