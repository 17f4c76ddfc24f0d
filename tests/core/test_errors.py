"""One clear error per kind of bad input, each naming the bad value and the valid choices."""

import pytest

import frugalnas
from frugalnas import ArchitectureParseError, ConfigError, UnknownComponentError
from frugalnas.ports.config import load_run_file


@pytest.mark.parametrize("kwargs, fragments", [
    ({"space": "nb2001"}, ["'nb2001'", "nb201"]),
    ({"strategy": "evolutionn"}, ["'evolutionn'", "random"]),
    ({"estimator": "trian"}, ["'trian'", "train", "nb201-table"]),
    ({"backend": "tpu"}, ["'tpu'", "single-device"]),
    ({"dataset": "cifar11"}, ["'cifar11'", "digits", "mnist5k"]),
])
def test_unknown_component_names(kwargs, fragments):
    with pytest.raises(UnknownComponentError) as info:
        frugalnas.create_study(disable_plugins=["mlflow"], **kwargs)
    for f in fragments:
        assert f in str(info.value)


def test_a_misspelt_component_name_gets_the_nearest_registered_one():
    with pytest.raises(UnknownComponentError,
                       match="'regularised-evolution'.*; did you mean 'regularized-evolution'") \
            as info:
        frugalnas.create_study(disable_plugins=["mlflow"], strategy="regularised-evolution")
    assert "local-search" in str(info.value)   # the full list is still there
    with pytest.raises(UnknownComponentError) as info:
        frugalnas.create_study(disable_plugins=["mlflow"], strategy="xyzzy")
    assert "did you mean" not in str(info.value)   # nothing close: no guess


def test_misspelt_options_objectives_and_choices_get_the_nearest_valid_name():
    cases = [
        (dict(strategy="regularized-evolution", strategy_options={"populaton_size": 10}),
         "unknown option 'populaton_size'.*; did you mean 'population_size'"),
        (dict(strategy="tpe", strategy_options={"n_startup_trial": 5}),
         "unknown option 'n_startup_trial'.*; did you mean 'n_startup_trials'"),
        (dict(estimator="nb201-table", constraints={"latency_ms_pixel": 10.0}),
         "constraint 'latency_ms_pixel'.*; did you mean 'latency_ms_pixel3'"),
        (dict(estimator="nb201-table", objectives=["value", "latency_ms_raspi"],
              directions=["maximize", "minimize"]),
         "objective 'latency_ms_raspi'.*; did you mean 'latency_ms_raspi4'"),
        (dict(estimator="nb201-table", estimator_options={"select_on": "vaild"}),
         "invalid nb201-table select_on 'vaild'.*; did you mean 'valid'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            frugalnas.create_study(disable_plugins=["mlflow"], **kwargs)


def test_wrong_config_key_in_create_study():
    with pytest.raises(ConfigError, match="unknown key 'estimator_option'.*did you mean 'estimator_options'"):
        frugalnas.create_study(disable_plugins=["mlflow"], estimator_option={"epochs": 1})


def test_wrong_config_key_in_run_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('space = "nb201"\nn_trails = 3\n')
    with pytest.raises(ConfigError, match="unknown key 'n_trails'.*did you mean 'n_trials'"):
        load_run_file(path)


def test_invalid_toml_and_missing_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("space = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_file(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_file(tmp_path / "nope.toml")


def test_bad_direction_and_objectives():
    with pytest.raises(ConfigError, match="invalid direction 'maximise'.*'maximize', 'minimize'"):
        frugalnas.create_study(disable_plugins=["mlflow"], direction="maximise")
    with pytest.raises(ConfigError, match="need as many objectives"):
        frugalnas.create_study(disable_plugins=["mlflow"], directions=["maximize", "minimize"])


def test_bad_option_values():
    with pytest.raises(ConfigError, match="invalid nb201-table dataset 'cifar12'.*'cifar10'"):
        frugalnas.create_study(disable_plugins=["mlflow"], estimator_options={"dataset": "cifar12"})
    with pytest.raises(ConfigError, match="invalid N .*-1"):
        frugalnas.create_study(disable_plugins=["mlflow"], space_options={"N": -1})
    with pytest.raises(ConfigError, match="invalid optimizer 'adamw'.*'sgd', 'adam'"):
        frugalnas.create_study(disable_plugins=["mlflow"], estimator="train", estimator_options={"optimizer": "adamw"})
    with pytest.raises(ConfigError, match="invalid n_trials -3"):
        frugalnas.create_study(disable_plugins=["mlflow"]).optimize(n_trials=-3)


def test_malformed_architecture_given_to_a_study():
    study = frugalnas.create_study(disable_plugins=["mlflow"])
    with pytest.raises(ArchitectureParseError, match="unknown NB201 operation 'conv_5x5'"):
        study.evaluate("|conv_5x5~0|+|none~0|none~1|+|none~0|none~1|none~2|")
