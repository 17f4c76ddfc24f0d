"""Elastic blocks: every configuration equals, bitwise on the CPU, the stand-alone block it
exports (same weights), in training and evaluation mode; the configurations share the one
set of weights."""

import itertools

import pytest
import torch

from frugalnas.ports.errors import ConfigError
from frugalnas.nn.elastic import (
    ElasticBatchNorm2d,
    ElasticConv2d,
    ElasticMBConv,
    ElasticStage,
    MBConv,
    MBConvConfig,
)

CONFIGS = [MBConvConfig(k, e, se) for k, e, se in itertools.product((3, 5, 7), (3, 4, 6),
                                                                      (False, True))]


def _randomise(module: torch.nn.Module) -> None:
    """Non-trivial weights, statistics and kernel transforms (identity transforms and unit
    batch norms would hide slicing mistakes)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in itertools.chain(module.named_parameters(), module.named_buffers()):
            if t.dtype.is_floating_point:
                t.copy_(torch.rand(t.shape, generator=g) + 0.5 if "running_var" in name
                        else torch.randn(t.shape, generator=g) * 0.5)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_mbconv_configuration_equals_its_export_bitwise(config, training):
    torch.manual_seed(0)
    block = ElasticMBConv(16, 16, stride=1, se=True)
    _randomise(block)
    block.train(training)
    standalone = block.export(config)
    assert isinstance(standalone, MBConv) and standalone.training == training
    x = torch.randn(4, 16, 9, 9, generator=torch.Generator().manual_seed(2))
    assert torch.equal(block(x, config), standalone(x))
    if training:  # running statistics moved the same way
        assert torch.equal(block.depthwise_bn.running_mean[:standalone.depthwise[1].num_features],
                           standalone.depthwise[1].running_mean)


def test_stride_and_channel_change_export_too():
    block = ElasticMBConv(8, 24, kernel_sizes=(3, 5), expand_ratios=(2, 6), stride=2, se=False)
    _randomise(block)
    block.eval()
    x = torch.randn(2, 8, 11, 11)
    for config in (MBConvConfig(3, 2), MBConvConfig(5, 6)):
        out = block(x, config)
        assert out.shape == (2, 24, 6, 6)
        assert torch.equal(out, block.export(config).eval()(x))


def test_configurations_share_one_set_of_weights():
    block = ElasticMBConv(8, 8)
    x = torch.randn(2, 8, 7, 7)
    block(x, MBConvConfig(3, 3, False)).sum().backward()
    grad = block.depthwise.weight.grad
    # A 3x3 kernel of ratio 3 trains the centre of the first hidden channels' 7x7 kernels
    # (through the kernel transforms), and nothing else.
    hidden = block.hidden(3)
    assert grad[:hidden, :, 2:5, 2:5].abs().sum() > 0
    assert grad[hidden:].abs().sum() == 0
    assert grad[:, :, 0].abs().sum() == 0
    assert block.depthwise.transforms["7to5"].grad is not None
    assert block.se.reduce.weight.grad is None  # SE off: its weights untouched


def test_elastic_conv_and_batch_norm_slices():
    conv = ElasticConv2d(6, 10, (1, 3))
    _randomise(conv)
    x = torch.randn(2, 4, 5, 5)   # fewer inputs than the largest: the first input channels
    assert torch.equal(conv(x, 7, 3), conv.export(4, 7, 3)(x))
    bn = ElasticBatchNorm2d(10)
    _randomise(bn)
    y = torch.randn(3, 6, 4, 4)
    bn.train()
    alone, before = bn.export(6).train(), bn.running_var.clone()
    assert torch.equal(bn(y), alone(y))
    assert torch.equal(bn.running_mean[:6], alone.running_mean)   # updated in place, alike
    assert not torch.equal(bn.running_var[:6], before[:6])
    assert torch.equal(bn.running_var[6:], before[6:])            # other channels untouched
    bn.eval()
    assert torch.equal(bn(y), bn.export(6).eval()(y))


def test_elastic_stage_runs_its_first_blocks():
    blocks = [ElasticMBConv(8, 16, stride=2), ElasticMBConv(16, 16), ElasticMBConv(16, 16)]
    stage = ElasticStage(blocks).eval()
    x = torch.randn(2, 8, 8, 8)
    configs = [MBConvConfig(5, 4, True), MBConvConfig(3, 6)]
    assert torch.equal(stage(x, configs), stage.export(configs).eval()(x))
    with pytest.raises(ConfigError, match="depth 4 outside 1..3"):
        stage(x, configs * 2)


@pytest.mark.parametrize("bad, match", [
    ({"kernel_sizes": (3, 4)}, "odd"),
    ({"expand_ratios": (1, 3)}, "ratio 1 cannot be mixed"),
    ({"kernel_sizes": ()}, "at least one positive choice"),
])
def test_bad_choices_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        ElasticMBConv(8, 8, **bad)


def test_a_configuration_outside_the_block_is_refused():
    block = ElasticMBConv(8, 8, se=False)
    x = torch.randn(1, 8, 4, 4)
    with pytest.raises(ConfigError, match=r"kernel 9 is not one of \[3, 5, 7\]"):
        block(x, MBConvConfig(9, 3))
    with pytest.raises(ConfigError, match="squeeze-excite asked of a block built without it"):
        block(x, MBConvConfig(3, 3, True))


# -- the conformance suite's elastic-block checks -----------------------------------------
def test_built_in_elastic_blocks_pass_the_conformance_checks():
    from frugalnas.testing import check_elastic_block

    block = ElasticMBConv(8, 8)
    _randomise(block)
    assert check_elastic_block(block, CONFIGS[::5], (8, 6, 6)) == [
        "check_export_matches_forward", "check_export_is_independent",
        "check_configurations_train_shared_weights"]
    stage = ElasticStage([ElasticMBConv(8, 16, stride=2), ElasticMBConv(16, 16)])
    check_elastic_block(stage, [[MBConvConfig(3, 3)], [MBConvConfig(7, 6, True)] * 2], (8, 6, 6))


def test_a_block_whose_export_differs_fails_naming_the_configuration():
    from frugalnas.testing import ConformanceError, check_elastic_block

    class Sloppy(ElasticMBConv):
        def export(self, config):   # forgets the kernel transforms
            alone = super().export(config)
            with torch.no_grad():
                alone.depthwise[0].weight.mul_(1.5)
            return alone

    with pytest.raises(ConformanceError, match=r"check_export_matches_forward.*"
                                               r"MBConvConfig\(kernel=3, expand=3, se=False\)"):
        check_elastic_block(Sloppy(8, 8), [MBConvConfig(3, 3)], (8, 5, 5))


def test_an_export_that_shares_the_blocks_tensors_fails():
    from frugalnas.testing import ConformanceError, check_elastic_block

    class Sharing(ElasticMBConv):
        def export(self, config):
            alone = super().export(config)
            alone.project[1] = self.project_bn   # the block's own batch norm
            return alone

    with pytest.raises(ConformanceError, match="shares .*project"):
        check_elastic_block(Sharing(8, 8), [MBConvConfig(3, 6)], (8, 5, 5),
                            checks=["check_export_is_independent"])


@pytest.mark.parametrize("momentum", [0.1, None])
def test_sliced_running_statistics_follow_batch_norm_for_every_momentum(momentum):
    """Batch-norm recalibration averages cumulatively (momentum None): a slice of an elastic
    batch norm must then update its statistics exactly as a plain batch norm of that width."""
    bn = ElasticBatchNorm2d(10, momentum=momentum)
    alone = torch.nn.BatchNorm2d(6, momentum=momentum)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        y = torch.randn(4, 6, 3, 3, generator=g) * 2 + 1
        assert torch.equal(bn.train()(y), alone.train()(y))
    assert torch.equal(bn.running_mean[:6], alone.running_mean)
    assert torch.equal(bn.running_var[:6], alone.running_var)
    assert not torch.equal(alone.running_mean, torch.zeros(6))
