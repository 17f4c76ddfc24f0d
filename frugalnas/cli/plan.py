"""The plan of a run, once the checks that need no engine have passed
(:func:`frugalnas.cli.main.check_run`): the study's components built by
:func:`~frugalnas.engine.planning.plan_study` (every other check before the first trial) and
the resolved settings ``--dry-run`` prints (component names, source plugins, every option
with its default, secrets masked)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from frugalnas.ports.config import StudyConfig
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.secrets import mask_value
from frugalnas.engine.planning import StudyPlan, plan_study


def plan(config: StudyConfig, run: dict[str, Any],
         host: PluginHost) -> tuple[dict[str, Any], StudyPlan]:
    """Build the study's components (:func:`~frugalnas.engine.planning.plan_study`:
    ``check_config``, that is components, options, dataset paths, objectives and each plugin's
    ``frugalnas_check_config``, then the components themselves). Nothing is written anywhere.
    Returns the resolved plan (names, source plugins, options with defaults) and the study
    plan that :func:`~frugalnas.engine.study.open_study` opens."""
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
