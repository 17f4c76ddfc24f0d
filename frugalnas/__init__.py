"""frugalnas: computationally efficient neural architecture search on plugins."""

from typing import TYPE_CHECKING

from frugalnas.core.lazy import lazy_attributes
from frugalnas.core.version import __version__

# The public names import their modules on first use (PEP 562), so ``import frugalnas`` and
# the command line's answers that need no torch, optuna or MLflow do not pay for them.
_EXPORTS: dict[str, str] = {
    "Architecture": "frugalnas.core.architecture",
    "ArchitectureParseError": "frugalnas.core.errors",
    "Backend": "frugalnas.core.backend",
    "Candidate": "frugalnas.core.study",
    "ConfigError": "frugalnas.core.errors",
    "Cost": "frugalnas.core.cost",
    "Dataset": "frugalnas.core.data",
    "DuplicateComponentError": "frugalnas.core.errors",
    "EstimateResult": "frugalnas.core.estimator",
    "Estimator": "frugalnas.core.estimator",
    "EvaluationContext": "frugalnas.core.estimator",
    "FrugalnasError": "frugalnas.core.errors",
    "PluginError": "frugalnas.core.errors",
    "PluginHost": "frugalnas.core.plugins",
    "SearchSpace": "frugalnas.core.space",
    "Study": "frugalnas.core.study",
    "StudyConfig": "frugalnas.core.config",
    "TrialContext": "frugalnas.core.estimator",
    "TrialFailure": "frugalnas.core.errors",
    "TrialRecord": "frugalnas.core.study",
    "TrialReport": "frugalnas.core.trial_report",
    "UnknownComponentError": "frugalnas.core.errors",
    "create_component": "frugalnas.core.plugins",
    "create_study": "frugalnas.core.study",
    "export_study": "frugalnas.export",
    "get_host": "frugalnas.core.plugins",
    "hookimpl": "frugalnas.core.plugins",
    "list_components": "frugalnas.core.plugins",
    "load_study": "frugalnas.core.study",
}

if TYPE_CHECKING:
    from frugalnas.core.architecture import Architecture
    from frugalnas.core.backend import Backend
    from frugalnas.core.config import StudyConfig
    from frugalnas.core.cost import Cost
    from frugalnas.core.data import Dataset
    from frugalnas.core.errors import (ArchitectureParseError, ConfigError,
                                       DuplicateComponentError, FrugalnasError, PluginError,
                                       TrialFailure, UnknownComponentError)
    from frugalnas.core.estimator import (EstimateResult, Estimator, EvaluationContext,
                                          TrialContext)
    from frugalnas.core.plugins import (PluginHost, create_component, get_host, hookimpl,
                                        list_components)
    from frugalnas.core.space import SearchSpace
    from frugalnas.core.runner import Candidate
    from frugalnas.core.study import Study, TrialRecord, create_study, load_study
    from frugalnas.core.trial_report import TrialReport
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
