"""Datasets, partitioners and federated views for raydpfl (no Ray dependency)."""

from raydpfl.data.datasets import (
    DATASET_FILES,
    DATASET_MD5,
    DATASET_URLS,
    DATASETS,
    ArrayDataset,
    DatasetNotFoundError,
    DownloadError,
    default_data_root,
    download_dataset,
    find_dataset_files,
    load_dataset,
    read_cifar10_binary,
    read_idx,
)
from raydpfl.data.federated import FederatedDataset, federate, synthetic_federated
from raydpfl.data.hf import load_hf_dataset
from raydpfl.data.partition import (
    PartitionStats,
    partition_dirichlet,
    partition_iid,
    partition_shards,
    partition_stats,
    split_train_test,
)
from raydpfl.data.partition_more import (
    client_sizes,
    partition_dirichlet_sizes,
    partition_k_classes,
    partition_natural,
    partition_size_skew,
)
from raydpfl.data.readers import (
    load_cifar100,
    load_femnist,
    load_image_folder,
    load_shakespeare,
    read_cifar100_binary,
    read_leaf_json,
)
from raydpfl.data.synthetic import make_synthetic

__all__ = [
    "DATASETS",
    "DATASET_FILES",
    "DATASET_MD5",
    "DATASET_URLS",
    "ArrayDataset",
    "DatasetNotFoundError",
    "DownloadError",
    "FederatedDataset",
    "PartitionStats",
    "client_sizes",
    "default_data_root",
    "download_dataset",
    "federate",
    "find_dataset_files",
    "load_cifar100",
    "load_dataset",
    "load_femnist",
    "load_hf_dataset",
    "load_image_folder",
    "load_shakespeare",
    "make_synthetic",
    "partition_dirichlet",
    "partition_dirichlet_sizes",
    "partition_iid",
    "partition_k_classes",
    "partition_natural",
    "partition_shards",
    "partition_size_skew",
    "partition_stats",
    "read_cifar10_binary",
    "read_cifar100_binary",
    "read_idx",
    "read_leaf_json",
    "split_train_test",
    "synthetic_federated",
]
