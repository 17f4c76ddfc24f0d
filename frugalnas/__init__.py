"""frugalnas: computationally efficient neural architecture search on plugins."""

from .core.architecture import Architecture
from .core.backend import Backend
from .core.config import StudyConfig
from .core.cost import Cost
from .core.data import Dataset
from .core.errors import (ArchitectureParseError, ConfigError, DuplicateComponentError,
                          FrugalnasError, PluginError, TrialFailure, UnknownComponentError)
from .core.estimator import EstimateResult, EvaluationContext, Estimator
from .core.plugins import PluginHost, create_component, get_host, hookimpl, list_components
from .core.space import SearchSpace
from .core.study import Candidate, Study, TrialRecord, create_study, load_study

__version__ = "0.1.0"

__all__ = [
    "Architecture", "ArchitectureParseError", "Backend", "Candidate", "ConfigError", "Cost",
    "Dataset", "DuplicateComponentError", "EstimateResult", "Estimator", "EvaluationContext",
    "FrugalnasError", "PluginError", "PluginHost", "SearchSpace", "Study", "StudyConfig",
    "TrialFailure", "TrialRecord", "UnknownComponentError", "create_component", "create_study",
    "get_host", "hookimpl", "list_components", "load_study",
]
