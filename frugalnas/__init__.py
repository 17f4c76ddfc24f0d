"""frugalnas: computationally efficient neural architecture search on plugins."""

from frugalnas.core.architecture import Architecture
from frugalnas.core.backend import Backend
from frugalnas.core.config import StudyConfig
from frugalnas.core.cost import Cost
from frugalnas.core.data import Dataset
from frugalnas.core.errors import (ArchitectureParseError, ConfigError, DuplicateComponentError,
                          FrugalnasError, PluginError, TrialFailure, UnknownComponentError)
from frugalnas.core.estimator import EstimateResult, Estimator, EvaluationContext, TrialContext
from frugalnas.core.plugins import PluginHost, create_component, get_host, hookimpl, list_components
from frugalnas.core.space import SearchSpace
from frugalnas.core.study import Candidate, Study, TrialRecord, create_study, load_study
from frugalnas.core.trial_report import TrialReport
from frugalnas.core.version import __version__
from frugalnas.export import export_study

__all__ = [
    "Architecture", "ArchitectureParseError", "Backend", "Candidate", "ConfigError", "Cost",
    "Dataset", "DuplicateComponentError", "EstimateResult", "Estimator", "EvaluationContext",
    "FrugalnasError", "PluginError", "PluginHost", "SearchSpace", "Study", "StudyConfig",
    "TrialContext", "TrialFailure", "TrialRecord", "TrialReport", "UnknownComponentError",
    "create_component", "create_study", "export_study", "get_host", "hookimpl",
    "list_components", "load_study",
]
