"""optuna's model-based samplers as named strategies: ``tpe``, ``nsga2``, ``nsga3`` and ``gp``.

Any optuna sampler already drives a frugalnas space (``space.suggest`` asks the trial for each
decision); registering them by name lets run files and the command line choose them and lets
the study hand them its constraints (:func:`frugalnas.multiobjective.sampler_constraint_options`:
with optuna >= 5 they read the constraint values the study records with
``trial.set_constraint``; with optuna 4 they get ``constraints_func``). In a study with
constraints, ``tpe``, ``nsga2`` and ``nsga3`` are wrapped in
:class:`~frugalnas.strategies.feasible_draws.FeasibleDraws`, which, when the estimator knows the
constrained metrics before evaluating, rejects their draws that are known to violate them and,
with one objective, takes the nearest-boundary of a few feasible draws. Their options are the
sampler classes' keyword arguments (``seed`` comes from the study), and for those three
``feasible_max_draws`` (100) and ``feasible_screen`` (10), :class:`FeasibleDraws`'s
``max_draws`` and ``screen``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from frugalnas.ports.errors import ConfigError, check_range, nearest_hint
from frugalnas.multiobjective.constraints import sampler_constraint_options
from frugalnas.strategies.feasible_draws import DEFAULT_MAX_DRAWS, DEFAULT_SCREEN, FeasibleDraws

#: Name -> (sampler class, summary).
OPTUNA_SAMPLERS: dict[str, tuple[str, str]] = {
    "tpe": ("TPESampler", "optuna's Tree-structured Parzen Estimator (Bergstra et al. 2011; "
            "constraints as in Watanabe & Hutter 2023)."),
    "nsga2": ("NSGAIISampler", "optuna's NSGA-II (Deb et al. 2002) with constrained "
              "domination; for several objectives."),
    "nsga3": ("NSGAIIISampler", "optuna's NSGA-III (Deb & Jain 2014); for many objectives."),
    "gp": ("GPSampler", "optuna's Gaussian-process Bayesian optimisation (constrained "
           "expected improvement)."),
}
#: The samplers whose draws are cheap enough to reject (:class:`FeasibleDraws`): with known
#: constraints they propose only architectures that meet them. A GP draw optimises an
#: acquisition function, too costly to repeat a hundred times a trial.
FEASIBLE_DRAWS = ("tpe", "nsga2", "nsga3")
#: Parameters of the sampler classes the study sets itself.
_SUPPLIED = ("self", "seed", "constraints_func")
#: Options of the samplers in :data:`FEASIBLE_DRAWS` that go to :class:`FeasibleDraws`.
_FEASIBLE_OPTIONS = {"feasible_max_draws": DEFAULT_MAX_DRAWS, "feasible_screen": DEFAULT_SCREEN}


def optuna_strategy(name: str) -> Callable[..., optuna.samplers.BaseSampler]:
    """A strategy factory ``f(space=, seed=, constraints=, **options)`` for optuna's sampler
    ``name`` that rejects unknown options with a ConfigError listing the valid ones."""
    cls_name, summary = OPTUNA_SAMPLERS[name]
    cls = getattr(optuna.samplers, cls_name)
    params = {p.name: p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name not in _SUPPLIED and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                        p.KEYWORD_ONLY)}
    own = dict(_FEASIBLE_OPTIONS) if name in FEASIBLE_DRAWS else {}
    valid = sorted([*params, *own])

    def factory(space: Any = None, seed: int = 0,
                constraints: Mapping[str, float] | None = None,
                **options: Any) -> optuna.samplers.BaseSampler:
        for key in options:
            if key not in params and key not in own:
                raise ConfigError(f"unknown option {key!r} for strategy {name!r}; valid "
                                  f"options: {', '.join(valid)}{nearest_hint(key, valid)}")
        draws = {key: options.pop(key, default) for key, default in own.items()}
        for key, value in draws.items():
            check_range(key, value, 1)
        with _quiet_experimental():
            sampler = cls(seed=seed, **sampler_constraint_options(constraints), **options)
        if name in FEASIBLE_DRAWS and constraints and space is not None:
            return FeasibleDraws(sampler, space, max_draws=int(draws["feasible_max_draws"]),
                                 screen=int(draws["feasible_screen"]))
        return sampler

    sig = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
           for n, d in (("space", None), ("seed", 0), ("constraints", None))]
    sig += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=inspect.Parameter.empty)
            for p in params.values()]
    sig += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
            for n, d in own.items()]
    factory.__signature__ = inspect.Signature(sig)  # type: ignore[attr-defined]
    factory.__doc__ = summary
    factory.__name__ = factory.__qualname__ = f"{cls_name}_factory"
    return factory


class _quiet_experimental:
    """optuna warns that some samplers (GP, NSGA-III) are experimental; the user chose them."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def optuna_strategies() -> dict[str, Callable[..., optuna.samplers.BaseSampler]]:
    return {name: optuna_strategy(name) for name in OPTUNA_SAMPLERS
            if hasattr(optuna.samplers, OPTUNA_SAMPLERS[name][0])}


# The factories by strategy name, as attributes the strategies plugin names lazily
# ("frugalnas.strategies.optuna_samplers:tpe"); optuna >= 4 has every sampler.
tpe = optuna_strategy("tpe")
nsga2 = optuna_strategy("nsga2")
nsga3 = optuna_strategy("nsga3")
gp = optuna_strategy("gp")
