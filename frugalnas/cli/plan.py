"""The plan of a run: every check that can run before the first trial, once, and the resolved
settings ``--dry-run`` prints (component names, source plugins, every option with its
default, secrets masked)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from frugalnas.ports.config import StudyConfig, check_run_settings
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.secrets import mask_value
from frugalnas.engine.storage_url import check_storage_url

if TYPE_CHECKING:  # the command line answers --help without the engine's libraries
    from frugalnas.engine.planning import StudyPlan


def plan(config: StudyConfig, run: dict[str, Any],
         host: PluginHost) -> tuple[dict[str, Any], StudyPlan]:
    """Run every check that can run before the first trial, once: the run settings, the
    storage URL (scheme, driver, directory), ``check_config`` (components, options, dataset
    paths, objectives, each plugin's ``frugalnas_check_config``) and creating the components
    (:func:`~frugalnas.engine.planning.plan_study`). Nothing is written anywhere. Returns the
    resolved plan (names, source plugins, options with defaults) and the study plan that
    :func:`~frugalnas.engine.study.open_study` opens."""
    check_run_settings(run)
    check_storage_url(run.get("storage"))
    check_names(config, host)
    from frugalnas.engine.planning import plan_study

    study_plan = plan_study(config, host)
    shown = config.stored_form(host.option_roles())  # passwords and secrets masked
    out: dict[str, Any] = {"run": mask_value(run)}
    for group, kind in (("space", "search_spaces"), ("strategy", "strategies"),
                        ("backend", "backends"), ("dataset", "datasets")):
        name = getattr(config, group)
        if name is None:
            continue
        comp = host.registry(kind).get(name)
        out[group] = {"name": name, "plugin": comp.plugin, "options": _with_defaults(
            comp, shown[f"{group}_options"], implicit=("space", "seed"))}
    comp = host.estimators().get(config.estimator)
    out["estimator"] = {"name": config.estimator, "plugin": comp.plugin,
                        "options": _with_defaults(comp, shown["estimator_options"])}
    out["objectives"] = dict(zip(config.objectives, config.directions))
    out["constraints"] = {name: f"<= {bound:g}" for name, bound in config.constraints.items()}
    if config.pruner is not None:
        comp = host.registry("pruners").get(config.pruner)
        out["pruner"] = {"name": config.pruner, "plugin": comp.plugin,
                         "options": _with_defaults(comp, shown["pruner_options"])}
    out["seed"] = config.seed
    out["plugin_options"] = shown["plugin_options"]
    out["plugins"] = sorted(host.infos)
    return out, study_plan


def _with_defaults(comp: Any, given: Mapping[str, Any],
                   implicit: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options ``given`` (masked already) over every default of ``comp``'s options,
    masked; ``implicit`` ones (set by the study itself) are left out."""
    defaults = {k: v for k, v in comp.options().items()
                if k not in implicit and v is not inspect.Parameter.empty}
    return {**mask_value(defaults), **given}


def check_names(config: StudyConfig, host: PluginHost) -> None:
    """An :class:`~frugalnas.ports.errors.UnknownComponentError` for the first component name of
    ``config`` that no plugin registers, read from the registries alone: a misspelt name is
    answered before any component's module (torch, scikit-learn, ...) is imported."""
    for group, kind in (("space", "search_spaces"), ("strategy", "strategies"),
                        ("backend", "backends"), ("dataset", "datasets")):
        name = getattr(config, group)
        if name is not None:
            host.registry(kind).get(name)
    host.estimators().get(config.estimator)
    if config.pruner is not None:
        host.registry("pruners").get(config.pruner)
