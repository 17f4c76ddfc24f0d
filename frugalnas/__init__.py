"""frugalnas: computationally efficient neural architecture search on plugins.

Everything a user and a plugin author needs is importable from here: the study API
(``create_study``, ``load_study``, ``Study``, ...), the ports a component implements
(``SearchSpace``, ``Estimator``, ``Backend``, ``Strategy``, ``Proxy``, ``Surrogate``,
``Launcher``, ...), the bases that do most of the work (``ArchSampler``), the capabilities a
space declares (``WeightSharing``, ...) and the plugin machinery (``hookimpl``,
``LazyFactory``, ``PluginHost``). The conformance kit is :mod:`frugalnas.testing`.
"""

from typing import TYPE_CHECKING

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.ports.version import __version__

# The public names import their modules on first use (PEP 562), so ``import frugalnas`` and
# the command line's answers that need no torch, optuna or MLflow do not pay for them.
_EXPORTS: dict[str, str] = {
    # running studies
    "Architecture": "frugalnas.ports.architecture",
    "ArchitectureParseError": "frugalnas.ports.errors",
    "Backend": "frugalnas.ports.backend",
    "Candidate": "frugalnas.engine.runner",
    "ConfigError": "frugalnas.ports.errors",
    "Cost": "frugalnas.ports.cost",
    "Dataset": "frugalnas.ports.data",
    "DuplicateComponentError": "frugalnas.ports.errors",
    "EstimateResult": "frugalnas.ports.estimator",
    "Estimator": "frugalnas.ports.estimator",
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
    "compress": "frugalnas.compression",
    "create_study": "frugalnas.engine.study",
    "export_study": "frugalnas.export",
    "get_host": "frugalnas.host.plugins",
    "hookimpl": "frugalnas.host.plugins",
    "list_components": "frugalnas.host.plugins",
    "load_study": "frugalnas.engine.study",
    # writing plugins
    "ArchSampler": "frugalnas.strategies.base",
    "History": "frugalnas.strategies.history",
    "strategy_factory": "frugalnas.strategies.base",
    "Strategy": "frugalnas.ports.strategy",
    "WrappingStrategy": "frugalnas.ports.strategy",
    "StrategyServices": "frugalnas.ports.strategy",
    "Proxy": "frugalnas.proxies.base",
    "ProxyCheckError": "frugalnas.proxies.checks",
    "Surrogate": "frugalnas.surrogates.base",
    "PastTrial": "frugalnas.ports.estimator",
    "OptunaTrialContext": "frugalnas.engine.trial_context",
    "OptionRoles": "frugalnas.ports.secrets",
    "StepLoss": "frugalnas.ports.backend",
    "ExportedNetwork": "frugalnas.ports.exported",
    "PluginNotAllowedError": "frugalnas.ports.errors",
    "refused_plugins": "frugalnas.host.loading",
    "LazyFactory": "frugalnas.host.registry",
    "split_arrays": "frugalnas.ports.data",
    "work_progress": "frugalnas.ports.work_progress",
    "Launcher": "frugalnas.distribution.launcher",
    "WorkerJob": "frugalnas.distribution.launcher",
    "BlockNetwork": "frugalnas.ports.network",
    "RelaxedBuilder": "frugalnas.ports.network",
    "SharedBuilder": "frugalnas.ports.network",
    "WeightSharing": "frugalnas.ports.capabilities",
    "ProgressiveShrinking": "frugalnas.ports.capabilities",
    "SandwichRule": "frugalnas.ports.capabilities",
    "DartsRelaxation": "frugalnas.ports.capabilities",
    "Scaling": "frugalnas.ports.capabilities",
    "OwnEncodings": "frugalnas.ports.capabilities",
    "capability": "frugalnas.ports.capabilities",
    "require_capability": "frugalnas.ports.capabilities",
    "sharing_by": "frugalnas.ports.capabilities",
    "scaling_by": "frugalnas.ports.capabilities",
    "CellGraph": "frugalnas.ports.capabilities",
    "itself": "frugalnas.ports.capabilities",
    "params_of": "frugalnas.ports.space",
    "LaunchError": "frugalnas.distribution.launcher",
    "split_indices": "frugalnas.ports.data",
    "open_storage": "frugalnas.engine.storage_url",
}

if TYPE_CHECKING:
    from frugalnas.distribution.launcher import LaunchError, Launcher, WorkerJob
    from frugalnas.engine.runner import Candidate
    from frugalnas.engine.storage_url import open_storage
    from frugalnas.engine.study import Study, TrialRecord, create_study, load_study
    from frugalnas.engine.trial_context import OptunaTrialContext
    from frugalnas.compression import compress
    from frugalnas.export import export_study
    from frugalnas.host.loading import refused_plugins
    from frugalnas.host.plugins import (PluginHost, create_component, get_host, hookimpl,
                                        list_components)
    from frugalnas.host.registry import LazyFactory
    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.backend import Backend, StepLoss
    from frugalnas.ports.capabilities import (CellGraph, DartsRelaxation, OwnEncodings,
                                              ProgressiveShrinking, SandwichRule, Scaling,
                                              WeightSharing, capability, itself,
                                              require_capability, scaling_by, sharing_by)
    from frugalnas.ports.config import StudyConfig
    from frugalnas.ports.cost import Cost
    from frugalnas.ports.data import Dataset, split_arrays, split_indices
    from frugalnas.ports.errors import (ArchitectureParseError, ConfigError,
                                        DuplicateComponentError, FrugalnasError, PluginError,
                                        PluginNotAllowedError, TrialFailure, UnknownComponentError)
    from frugalnas.ports.estimator import EstimateResult, Estimator, PastTrial, TrialContext
    from frugalnas.ports.exported import ExportedNetwork
    from frugalnas.ports.network import BlockNetwork, RelaxedBuilder, SharedBuilder
    from frugalnas.ports.secrets import OptionRoles
    from frugalnas.ports.space import SearchSpace, params_of
    from frugalnas.ports.strategy import Strategy, StrategyServices, WrappingStrategy
    from frugalnas.ports.trial_report import TrialReport
    from frugalnas.ports.work_progress import work_progress
    from frugalnas.proxies.base import Proxy
    from frugalnas.proxies.checks import ProxyCheckError
    from frugalnas.strategies.base import ArchSampler, strategy_factory
    from frugalnas.strategies.history import History
    from frugalnas.surrogates.base import Surrogate


__getattr__ = lazy_attributes(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "ArchSampler", "Architecture", "ArchitectureParseError", "Backend", "BlockNetwork",
    "Candidate", "CellGraph", "ConfigError", "Cost", "DartsRelaxation", "Dataset",
    "DuplicateComponentError", "EstimateResult", "Estimator", "ExportedNetwork",
    "FrugalnasError", "History", "LaunchError", "Launcher", "LazyFactory", "OptionRoles",
    "OptunaTrialContext", "OwnEncodings", "PastTrial", "PluginError", "PluginHost",
    "PluginNotAllowedError", "ProgressiveShrinking", "Proxy", "ProxyCheckError",
    "RelaxedBuilder", "SandwichRule", "Scaling", "SearchSpace", "SharedBuilder", "StepLoss", "Strategy",
    "StrategyServices", "Study", "StudyConfig", "Surrogate", "TrialContext", "TrialFailure",
    "TrialRecord", "TrialReport", "UnknownComponentError", "WeightSharing", "WorkerJob",
    "WrappingStrategy", "capability", "compress", "create_component", "create_study",
    "export_study",
    "get_host", "hookimpl", "itself", "list_components", "load_study", "open_storage",
    "params_of", "refused_plugins", "require_capability", "scaling_by", "sharing_by",
    "split_arrays", "split_indices", "strategy_factory", "work_progress",
]
