"""The plugins that ship with frugalnas: plugin name -> module. The host loads them first, by
name, exactly as it loads third-party plugins; ``-p no:NAME`` blocks any of them."""

from __future__ import annotations

BUILTIN_PLUGINS: dict[str, str] = {
    "nb201": "frugalnas.spaces.nb201",
    "dag": "frugalnas.spaces.dag",
    "define-by-run": "frugalnas.spaces.define_by_run",
    "mobilenet": "frugalnas.spaces.mobilenet",
    "gpt": "frugalnas.spaces.gpt",
    "vit": "frugalnas.spaces.vit",
    "latency": "frugalnas.latency",
    "datasets": "frugalnas.datasets.plugin",
    "estimators": "frugalnas.estimators",
    "single-device": "frugalnas.backends.single_device_plugin",
    "random": "frugalnas.strategies.random_plugin",
    "strategies": "frugalnas.strategies",
    "proxies": "frugalnas.proxies",
    "surrogates": "frugalnas.surrogates",
    "sievo": "frugalnas.sievo",
    "weight-sharing": "frugalnas.weight_sharing",
    "virtual-node": "frugalnas.backends.virtual_node.plugin",
    "out-of-core": "frugalnas.backends.out_of_core.plugin",
    "mlflow": "frugalnas.tracking.mlflow.plugin",
    "progress": "frugalnas.progress",
    "export": "frugalnas.export",
    "multiobjective": "frugalnas.multiobjective",
    "launchers": "frugalnas.launchers",
    "compress": "frugalnas.compression",
}
