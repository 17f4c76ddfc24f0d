"""Zero-cost proxies, rank ensembles, low-fidelity training and proxy pre-screening."""

from .base import Proxy, ProxyEstimator, proxy_batch
from .checks import ProxyCheckError, check_proxy

__all__ = ["Proxy", "ProxyCheckError", "ProxyEstimator", "check_proxy", "proxy_batch"]
