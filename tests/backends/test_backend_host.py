"""The virtual-node backend creates its inner backend from the study's plugin host; its worker
processes rebuild that host from ``host.spec()``; a study shares one backend (and one process
group) between concurrent trials and frees the workers when ``optimize`` ends."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.backends.out_of_core.backend import OutOfCoreBackend
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.backends.virtual_node.world import ProcessWorld
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost, hookimpl

PROBE = "vnode_probe_plugin"
PROBE_SOURCE = '''
"""A backend plugin that records, in every process that creates it, the host it came from."""
import json
import os

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.host.plugins import hookimpl


class ProbeBackend(SingleDeviceBackend):
    name = "probe"

    def __init__(self, device="auto", marker_dir=".", host=None):
        super().__init__(device)
        self.micro_batches = 0
        record = {"rank": int(os.environ.get("RANK", 0)),
                  "spec": host.spec() if host is not None else None}
        with open(os.path.join(marker_dir, f"probe-{os.getpid()}.json"), "w") as f:
            json.dump(record, f)

    def forward_backward(self, *args, **kwargs):
        self.micro_batches += 1
        return super().forward_backward(*args, **kwargs)

    def trial_outputs(self):
        n, self.micro_batches = self.micro_batches, 0
        return ({"probe_micro_batches": float(n)}, {"probe.txt": str(n)}) if n else ({}, {})


@hookimpl
def frugalnas_backends():
    return {"probe": ProbeBackend}
'''
LOSS = nn.CrossEntropyLoss()


@pytest.fixture
def probe(tmp_path, monkeypatch) -> Path:
    """The probe plugin as an importable module (here and, through PYTHONPATH, in workers);
    returns the folder its backends write their records to."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / f"{PROBE}.py").write_text(textwrap.dedent(PROBE_SOURCE))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p))
    markers = tmp_path / "markers"
    markers.mkdir()
    return markers


def records(markers: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in markers.glob("probe-*.json")),
                  key=lambda r: r["rank"])


class ObjectPlugin:
    """A plugin passed as an object: it cannot be rebuilt in another process."""

    @hookimpl
    def frugalnas_backends(self):
        return {"object-backend": SingleDeviceBackend}


def tiny_study(**options):
    options.setdefault("backend_options", {})
    return frugalnas.create_study(
        space="nb201", estimator="train", dataset="digits", seed=0,
        space_options={"N": 1, "C": 4}, estimator_options={"epochs": 1, "max_steps": 2},
        backend="virtual-node", disable_plugins=["mlflow"], **options)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def train_one_step(backend) -> float:
    torch.manual_seed(0)
    model = backend.prepare(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    return backend.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), LOSS,
                              *batch(), 0)


def test_inner_backend_comes_from_the_study_host(probe):
    study = tiny_study(plugins=[PROBE], backend_options={
        "virtual_nodes": 2, "inner": "probe", "inner_options": {"marker_dir": str(probe)}})
    study.optimize(1)
    trial = study.trials[0]
    assert trial.state.name == "COMPLETE", trial.user_attrs.get("fail_reason")
    assert study.backend.host is study.host
    [record] = records(probe)
    assert record["spec"] == study.host.spec()
    assert PROBE in record["spec"]["plugins"] and "mlflow" in record["spec"]["disable_plugins"]
    metrics = trial.user_attrs["metrics"]
    assert metrics["probe_micro_batches"] == 4.0          # 2 steps x 2 virtual nodes
    assert metrics["vnode_steps"] == 2.0 and metrics["vnode_virtual_nodes"] == 2.0


def test_built_directly_an_inner_backend_needs_a_host():
    """No hidden host: built directly, a plugin inner backend needs host= (a study passes its
    own); the single-device fast path needs none."""
    with pytest.raises(ConfigError, match="inner backend 'out-of-core' is created from a plugin "
                                          "host; pass host="):
        VirtualNodeBackend(virtual_nodes=2, inner="out-of-core", device="cpu")
    backend = VirtualNodeBackend(virtual_nodes=2, inner="out-of-core", host=PluginHost(),
                                 inner_options={"profile_repeats": 0}, device="cpu")
    assert isinstance(backend.host, PluginHost) and isinstance(backend.inner, OutOfCoreBackend)
    assert backend.host.spec() == {"plugins": [], "disable_plugins": [], "autoload": True}
    assert train_one_step(backend) > 0
    plain = VirtualNodeBackend(virtual_nodes=2, device="cpu")   # the fast path needs no host
    assert plain.host is None and isinstance(plain.inner, SingleDeviceBackend)
    assert train_one_step(plain) > 0


def test_inner_backend_from_a_plugin_object_cannot_travel():
    host = PluginHost([ObjectPlugin()], disable_plugins=["mlflow"])
    for options in ({"nproc": 2}, {"nproc": 1, "world_size": 2}):
        with pytest.raises(ConfigError, match="passed as an object") as err:
            host.create("backends", "virtual-node", inner="object-backend", device="cpu", **options)
        assert "ObjectPlugin" in str(err.value) and "object-backend" in str(err.value)
    one = host.create("backends", "virtual-node", inner="object-backend", device="cpu")
    assert one.host is host and train_one_step(one) > 0   # one process: nothing travels
    with pytest.raises(ConfigError, match="passed as an object"):   # before the study exists
        tiny_study(plugins=[ObjectPlugin()], backend_options={
            "nproc": 2, "inner": "object-backend"})
    with pytest.raises(ConfigError, match="unknown backend"):
        tiny_study(backend_options={"inner": "no-such-backend"})
    with pytest.raises(ConfigError, match="inner_options key 'device'"):
        VirtualNodeBackend(inner_options={"device": "cpu"})
    with pytest.raises(ConfigError, match="budget_frac"):
        tiny_study(backend_options={"inner": "out-of-core",
                                    "inner_options": {"budget_frac": 0.5}})


@pytest.mark.slow
def test_workers_rebuild_the_host_from_its_spec(probe, monkeypatch):
    host = PluginHost([PROBE], disable_plugins=["mlflow"])
    backend = VirtualNodeBackend(virtual_nodes=2, nproc=2, inner="probe", device="cpu",
                                 inner_options={"marker_dir": str(probe)}, host=host, timeout=60)
    try:
        # a worker that cannot load the plugin says so at start-up, without waiting for a timeout
        monkeypatch.delenv("PYTHONPATH")
        monkeypatch.chdir(probe)
        with pytest.raises(ConfigError, match=f"rank 1: PluginError: plugin '{PROBE}'"):
            train_one_step(backend)
        monkeypatch.setenv("PYTHONPATH", str(probe.parent / "plugin"))   # now it can
        assert train_one_step(backend) > 0
        ranks = records(probe)
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["spec"] == host.spec() for r in ranks)
        metrics, artifacts = backend.trial_outputs()
        assert metrics["probe_micro_batches"] == 1.0      # rank 0 ran one of the two nodes
        assert metrics["vnode_share_rank0"] == metrics["vnode_share_rank1"] == 1.0
        assert artifacts == {"probe.txt": "1"}
    finally:
        backend.close()


@pytest.mark.slow
def test_concurrent_trials_share_one_process_group_and_release_frees_it():
    study = tiny_study(backend_options={"virtual_nodes": 2, "nproc": 2, "timeout": 120})
    started = ProcessWorld.started
    study.optimize(4, n_jobs=2)
    assert ProcessWorld.started - started == 1            # one backend, one process group
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    backend = study.backend
    assert not backend._world.running                     # released when optimize ended
    for trial in study.trials:
        metrics = trial.user_attrs["metrics"]
        assert metrics["vnode_world_size"] == 2.0 and metrics["vnode_steps"] == 2.0
        assert metrics["vnode_share_rank0"] == metrics["vnode_share_rank1"] == 1.0
    study.optimize(1)                                     # works again after release()
    assert study.backend is backend and ProcessWorld.started - started == 2
    assert study.trials[-1].state.name == "COMPLETE" and len(study.trials) == 5
    assert not backend._world.running
