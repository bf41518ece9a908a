"""The config layer lists dataset names itself (it must not import `raydpfl.data`, see
test_architecture.py); these tests keep its lists and the data layer's in step."""

from typing import get_args

from raydpfl.config import schema
from raydpfl.data import datasets


def test_every_loadable_dataset_is_a_valid_config_value_and_synthetic_is_the_only_extra():
    config_names = set(get_args(schema.DatasetName))

    assert set(datasets.DATASETS) <= config_names
    assert config_names - set(datasets.DATASETS) == {"synthetic"}


def test_the_config_and_the_data_layer_agree_on_the_regression_datasets():
    assert schema.REGRESSION_DATASETS == datasets.REGRESSION_DATASETS
