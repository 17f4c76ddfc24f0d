"""frugalnas: computationally efficient neural architecture search on plugins."""

from typing import TYPE_CHECKING

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.ports.version import __version__

# The public names import their modules on first use (PEP 562), so ``import frugalnas`` and
# the command line's answers that need no torch, optuna or MLflow do not pay for them.
_EXPORTS: dict[str, str] = {
    "Architecture": "frugalnas.ports.architecture",
    "ArchitectureParseError": "frugalnas.ports.errors",
    "Backend": "frugalnas.ports.backend",
    "Candidate": "frugalnas.engine.study",
    "ConfigError": "frugalnas.ports.errors",
    "Cost": "frugalnas.ports.cost",
    "Dataset": "frugalnas.ports.data",
    "DuplicateComponentError": "frugalnas.ports.errors",
    "EstimateResult": "frugalnas.ports.estimator",
    "Estimator": "frugalnas.ports.estimator",
    "EvaluationContext": "frugalnas.ports.estimator",
    "FrugalnasError": "frugalnas.ports.errors",
    "PluginError": "frugalnas.ports.errors",
    "PluginHost": "frugalnas.host.plugins",
    "SearchSpace": "frugalnas.ports.space",
    "Study": "frugalnas.engine.study",
    "StudyConfig": "frugalnas.ports.config",
    "TrialContext": "frugalnas.ports.estimator",
    "TrialFailure": "frugalnas.ports.errors",
    "TrialRecord": "frugalnas.engine.study",
    "TrialReport": "frugalnas.ports.trial_report",
    "UnknownComponentError": "frugalnas.ports.errors",
    "create_component": "frugalnas.host.plugins",
    "create_study": "frugalnas.engine.study",
    "export_study": "frugalnas.export",
    "get_host": "frugalnas.host.plugins",
    "hookimpl": "frugalnas.host.plugins",
    "list_components": "frugalnas.host.plugins",
    "load_study": "frugalnas.engine.study",
}

if TYPE_CHECKING:
    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.backend import Backend
    from frugalnas.ports.config import StudyConfig
    from frugalnas.ports.cost import Cost
    from frugalnas.ports.data import Dataset
    from frugalnas.ports.errors import (ArchitectureParseError, ConfigError,
                                       DuplicateComponentError, FrugalnasError, PluginError,
                                       TrialFailure, UnknownComponentError)
    from frugalnas.ports.estimator import (EstimateResult, Estimator, EvaluationContext,
                                          TrialContext)
    from frugalnas.host.plugins import (PluginHost, create_component, get_host, hookimpl,
                                        list_components)
    from frugalnas.ports.space import SearchSpace
    from frugalnas.engine.runner import Candidate
    from frugalnas.engine.study import Study, TrialRecord, create_study, load_study
    from frugalnas.ports.trial_report import TrialReport
    from frugalnas.export import export_study


__getattr__ = lazy_attributes(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Architecture", "ArchitectureParseError", "Backend", "Candidate", "ConfigError", "Cost",
    "Dataset", "DuplicateComponentError", "EstimateResult", "Estimator", "EvaluationContext",
    "FrugalnasError", "PluginError", "PluginHost", "SearchSpace", "Study", "StudyConfig",
    "TrialContext", "TrialFailure", "TrialRecord", "TrialReport", "UnknownComponentError",
    "create_component", "create_study", "export_study", "get_host", "hookimpl",
    "list_components", "load_study",
]
