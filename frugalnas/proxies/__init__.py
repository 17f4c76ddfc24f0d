"""Zero-cost proxies and rank ensembles (built-in plugin ``proxies``): each proxy scores an
untrained network, and every proxy is also an estimator of its own name."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import PluginHost, hookimpl
from frugalnas.host.registry import LazyFactory

__all__ = ["LatencyProbe", "Proxy", "ProxyBatch", "ProxyCheckError", "ProxyEstimator"]

__getattr__ = lazy_attributes(__name__, {
    **{name: "frugalnas.proxies.base" for name in ("LatencyProbe", "Proxy", "ProxyBatch",
                                                    "ProxyEstimator")},
    "ProxyCheckError": "frugalnas.proxies.checks"})

#: name -> (module:class, summary): the built-in proxies, registered without importing them
#: (nor torch); the summary is the first paragraph of the class's docstring.
PROXIES: dict[str, tuple[str, str]] = {
    "synflow": ("gradient:Synflow", "synflow: synaptic flow, sum of |w * dR/dw| on an all-ones "
                                    "input (data-free)."),
    "snip": ("gradient:Snip", "snip: sum of |dL/dw * w| over all weights."),
    "grasp": ("gradient:Grasp", "grasp: sum of -w * (H g), H g the Hessian-gradient product of "
                                "the loss."),
    "grad_norm": ("gradient:GradNorm", "grad_norm: sum over layers of the L2 norm of the loss "
                                       "gradient (Abdelfattah et al. 2021)."),
    "fisher": ("gradient:Fisher", "fisher: sum over channels of 0.5 * E_batch[(sum_spatial a * "
                                  "dL/da)^2]."),
    "plain": ("gradient:Plain", "plain: sum of dL/dw * w over all weights, signs kept."),
    "jacob_cov": ("activation:JacobCov", "jacob_cov: how uncorrelated the input Jacobians of the "
                                         "batch are."),
    "naswot": ("activation:Naswot", "naswot: log|det K| of the kernel of binary ReLU activation "
                                    "codes over one batch."),
    "zen": ("activation:Zen", "zen: Zen-score, expressivity of the pre-pooling features on "
                              "Gaussian inputs (data-free)."),
    "params": ("size:Params", "params: the number of trainable parameters (a strong baseline; "
                              "Abdelfattah et al. 2021)."),
    "flops": ("size:Flops", "flops: forward FLOPs for one input sample (Abdelfattah et al. "
                            "2021)."),
    "decoder_params": ("size:DecoderParams", "decoder_params: the parameters of a language "
                       "model's decoder, without token or position embeddings and the output "
                       "head (LiteTransformerSearch, Javaheripi et al., NeurIPS 2022, found it "
                       "ranks GPT networks of one family by perplexity without training)."),
    "l2_norm": ("size:L2Norm", "l2_norm: sum over layers of the L2 norm of the initial weights "
                               "(Abdelfattah et al. 2021)."),
    # proxies of 2021-2024 (ZiCo, MeCo, SWAP, AZ-NAS, TE-NAS, EPE-NAS)
    "zico": ("zico:ZiCo", "zico: sum over layers of log sum |E[g]| / std[g], gradients over "
                          "batch parts (Li et al., ICLR 2023)."),
    "meco": ("meco:MeCo", "meco: sum over layers of the minimum eigenvalue of the channel "
                          "correlation of the feature map of one random input (Jiang et al., "
                          "NeurIPS 2023; data-free)."),
    "swap": ("swap:Swap", "swap: number of distinct sample-wise ReLU activation patterns over a "
                          "batch of ``samples`` inputs (Peng et al., ICLR 2024)."),
    "swap_reg": ("swap:SwapReg", "swap_reg: regularised SWAP-Score, log SWAP - (Theta - mu)^2 / "
                                 "sigma (Peng et al., ICLR 2024)."),
    "az_expressivity": ("aznas:AZExpressivity", "az_expressivity: sum over primary blocks of "
                        "the entropy of the normalised channel covariance spectrum of their "
                        "outputs (AZ-NAS, Lee & Ham, CVPR 2024)."),
    "az_progressivity": ("aznas:AZProgressivity", "az_progressivity: the smallest increase of "
                         "block expressivity from one primary block to the next (AZ-NAS, Lee & "
                         "Ham, CVPR 2024)."),
    "az_trainability": ("aznas:AZTrainability", "az_trainability: mean over primary blocks of "
                        "2 - sigma - 1/sigma, sigma the spectral norm of the block's Jacobian "
                        "estimated with a Rademacher vector (AZ-NAS, Lee & Ham, CVPR 2024)."),
    "ntk_cond": ("tenas:NTKCondition", "ntk_cond: minus the condition number of the empirical "
                 "NTK of ``samples`` inputs (gradients of each sample's summed logits w.r.t. "
                 "every weight tensor; Chen et al., ICLR 2021)."),
    "linear_regions": ("tenas:LinearRegions", "linear_regions: number of distinct ReLU "
                       "activation patterns over ``samples`` Gaussian inputs of ``size x size`` "
                       "pixels, an estimate of the number of linear regions (Chen et al., ICLR "
                       "2021; data-free)."),
    "epe_nas": ("epe:EpeNas", "epe_nas: sum over classes of |sum log(|corr| + 1e-5)| of the "
                              "per-class input-Jacobian correlations (Lopes et al., ICANN 2021)."),
}


@hookimpl
def frugalnas_proxies() -> dict[str, Any]:
    return {name: LazyFactory(f"frugalnas.proxies.{target}", summary)
            for name, (target, summary) in PROXIES.items()}


@hookimpl
def frugalnas_derived_estimators(host: PluginHost) -> dict[str, Any]:
    """Every proxy of ``host`` as an estimator of its own name, belonging to the plugin that
    registered the proxy."""
    return {component["name"]: LazyFactory(
                "frugalnas.proxies.base:ProxyEstimator",
                f"The {component['name']} proxy as an estimator: {component['summary']}",
                args=(component["name"],), derived_from=("proxies", component["name"]))
            for component in host.registry("proxies").describe()}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {
        "rank-ensemble": LazyFactory(
            "frugalnas.proxies.ensemble:RankEnsembleEstimator",
            "Mean percentile rank of several zero-cost proxies among the trials seen so far."),
        "learned-ensemble": LazyFactory(
            "frugalnas.proxies.ensemble:LearnedEnsembleEstimator",
            "Rank ensemble whose proxy weights are fitted on trials also scored by a teacher."),
    }
