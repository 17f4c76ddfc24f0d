"""The rules of the proxy contract (internal: the public entry point is
``frugalnas.testing.check_proxy``, which runs :func:`_run_rules` as the conformance suite's
``check_proxy_contract`` and raises a ``ConformanceError`` that is also a
:class:`ProxyCheckError`)::

    from frugalnas.testing import check_proxy
    check_proxy(MyProxy())          # or check_proxy("my_proxy", host) once registered
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn

from frugalnas.proxies.base import Proxy
from frugalnas.spaces.nb201.space import NB201Space


class ProxyCheckError(AssertionError):
    """A proxy broke the proxy contract; the message says which rule (``rule``) and how
    (``detail``)."""

    def __init__(self, message: str, rule: str = "", detail: str = ""):
        super().__init__(message)
        self.rule, self.detail = rule, detail


#: small NB201 networks the check scores: a typical cell and a degenerate (all-zero) one
CHECK_CELLS = (
    "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|",
    "|none~0|+|none~0|none~1|+|none~0|none~1|none~2|",
)


def _fail(proxy: Any, rule: str, detail: str) -> None:
    name = getattr(proxy, "name", type(proxy).__name__)
    raise ProxyCheckError(f"proxy {name!r} fails check {rule!r}: {detail}", rule, detail)


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "modes": [m.training for m in model.modules()],
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
        "flags": [p.requires_grad for p in model.parameters()],
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between two snapshots, or None."""
    for k, v in a["state"].items():
        w = b["state"][k]
        if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):
            return f"tensor {k!r} changed"
    if a["modes"] != b["modes"]:
        return "a module's training mode changed"
    if a["flags"] != b["flags"]:
        return "a parameter's requires_grad changed"
    for i, (g, h) in enumerate(zip(a["grads"], b["grads"])):
        if (g is None) != (h is None) or (g is not None and not torch.equal(g, h)):
            return f"the .grad of parameter #{i} changed"
    return None


def _nets(seed: int = 0) -> list[nn.Module]:
    space = NB201Space(N=1, C=8)
    nets = []
    for cell in CHECK_CELLS:
        torch.manual_seed(seed)
        nets.append(space.build(space.parse(cell), num_classes=10, input_shape=(3, 16, 16)))
    return nets


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)


#: Every rule, in the order they run; ``labels-optional`` applies only to a proxy with
#: ``needs_labels=False``, ``data-free`` only to one with ``needs_data=False``.
RULES = ("declares-needs", "init-params", "scores", "finite-float", "no-mutation",
         "deterministic", "labels-optional", "data-free")


def _run_rules(proxy: Proxy) -> list[str]:
    """Run every rule that applies to ``proxy``; returns their names (in :data:`RULES`
    order), raises :class:`ProxyCheckError` at the first broken one."""
    passed = []

    # declarations
    if not isinstance(proxy, Proxy):
        _fail(proxy, "is-a-proxy", f"{type(proxy).__name__} does not subclass frugalnas Proxy")
    for attr in ("needs_data", "needs_labels"):
        if not isinstance(getattr(type(proxy), attr, None), bool):
            _fail(proxy, "declares-needs", f"class attribute {attr} must be declared True/False")
    if not isinstance(getattr(proxy, "name", None), str) or not proxy.name:
        _fail(proxy, "declares-needs", "class attribute name must be a non-empty string")
    passed.append("declares-needs")

    # parameters in __init__, stored under their names (scikit-learn style)
    sig = inspect.signature(type(proxy).__init__)
    for n, p in sig.parameters.items():
        if n == "self":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            _fail(proxy, "init-params", f"__init__ takes *{n}; list every parameter explicitly")
        if p.default is p.empty:
            _fail(proxy, "init-params", f"__init__ parameter {n!r} needs a default")
        if not hasattr(proxy, n):
            _fail(proxy, "init-params", f"__init__ parameter {n!r} is not stored as self.{n}")
    try:
        clone = type(proxy)(**proxy.get_params())
    except Exception as exc:  # noqa: BLE001 - report any failure to rebuild
        _fail(proxy, "init-params", f"cannot be rebuilt from get_params(): {exc}")
    passed.append("init-params")

    x, y = _batch(0)
    for net_index, net in enumerate(_nets()):
        for mode in (True, False):
            net.train(mode)
            before = _snapshot(net)
            try:
                value = proxy.score(net, x, y)
            except Exception as exc:  # noqa: BLE001
                _fail(proxy, "scores", f"raised {type(exc).__name__}: {exc} (net #{net_index})")
            if not isinstance(value, float) or not math.isfinite(value):
                _fail(proxy, "finite-float", f"returned {value!r} on net #{net_index}; expected a "
                      "finite float (score dead networks low, not -inf/nan)")
            diff = _same(before, _snapshot(net))
            if diff:
                _fail(proxy, "no-mutation", f"{diff} (net #{net_index}, train={mode})")
            again = proxy.score(net, x, y)
            if not math.isclose(value, again, rel_tol=1e-6, abs_tol=1e-9):
                _fail(proxy, "deterministic", f"scored {value!r} then {again!r} on the same net")
        if net_index > 0:
            continue
        rebuilt = _nets()[net_index]
        rebuilt.train(True)
        net.train(True)
        if not math.isclose(clone.score(rebuilt, x, y), proxy.score(net, x, y), rel_tol=1e-6,
                            abs_tol=1e-9):
            _fail(proxy, "deterministic", "a rebuilt proxy on a rebuilt network (same seed) "
                  "scores differently")
    passed += ["scores", "finite-float", "no-mutation", "deterministic"]

    net = _nets()[0]
    if not proxy.needs_labels:
        try:
            no_labels = proxy.score(net, x, None)
        except Exception as exc:  # noqa: BLE001
            _fail(proxy, "labels-optional", f"needs_labels=False but failed without labels: {exc}")
        if not math.isclose(no_labels, proxy.score(net, x, y), rel_tol=1e-6, abs_tol=1e-9):
            _fail(proxy, "labels-optional", "needs_labels=False but the labels change the score")
        passed.append("labels-optional")
    if not proxy.needs_data:
        x2, y2 = _batch(1)
        if not math.isclose(proxy.score(net, x2, y2), proxy.score(net, x, y), rel_tol=1e-6,
                            abs_tol=1e-9):
            _fail(proxy, "data-free", "needs_data=False but the input values change the score")
        passed.append("data-free")
    return passed
