"""Training data through Ray Data: seeded synthetic data, or parquet/csv/jsonl from a path or s3://.

Two kinds of data, chosen by the recipe (`recipes.Recipe.data_kind`):
- tabular: feature columns plus a label column (default `y`); synthetic tabular data has features
  `x0..x{n-1}` (`trainer.config.features`, default 8);
- text: a `text` column.

Own loops (`trainer.entrypoint`) get the data as it is written (any columns); synthetic data for them
is tabular. `data.validation` adds a held-out dataset (`validation`): a seeded share of the training
data, or its own uri.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import ray.data

from rayship import api
from rayship_workloads import storage

DataKind = Literal["tabular", "text"]
LABEL = "y"
TEXT = "text"
READERS = {"parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "jsonl": ray.data.read_json}
PARQUET_V2_ENV = "RAY_DATA_USE_DATASOURCE_V2"  # Ray Data's switch; a value set in the environment wins


class DataError(ValueError):
    """The training data does not fit the spec: the message starts with the field to fix."""


_WORDS = (
    "the a ray cluster trains models on gpus while workers share gradients and checkpoints survive".split()
)


def data_uri(spec: api.DataSpec) -> str:
    if spec.uri is None:  # the API's rules require it with source: uri
        raise DataError("spec.data.uri: required with source: uri")
    return spec.uri


def data_format(spec: api.DataSpec) -> str:
    """`data.format`, else the uri's extension (the API requires a known one when format is unset)."""
    return spec.format or data_uri(spec).rsplit(".", 1)[-1]


def synthetic_arrays(samples: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with y = x·w + 0.5·sin(x0) + noise. `w` depends on the seed only, so every sample
    size draws from the same function; the same seed gives the same rows."""
    w = np.random.default_rng(seed).normal(size=features).astype(np.float32)
    rng = np.random.default_rng([seed, samples])
    x = rng.normal(size=(samples, features)).astype(np.float32)
    y = x @ w + 0.5 * np.sin(x[:, 0]) + 0.05 * rng.normal(size=samples).astype(np.float32)
    return x, y


SYNTHETIC_BLOCKS = 8  # blocks of synthetic data: Ray Data works on them in parallel


def as_blocks(table: pa.Table) -> ray.data.Dataset:
    """`table` as a Ray Dataset of SYNTHETIC_BLOCKS Arrow blocks.

    `from_blocks` takes the tables as the blocks and reads their metadata here, in the driver;
    `from_arrow` sends a task per block to read it, which on a fresh local Ray started (and
    imported Ray Data into) a worker process each: 2.5 s for 8 blocks on 2 cores, against 0.08 s.
    `from_items` makes up to 200 blocks (Ray Data's read_op_min_num_blocks), one per row of a
    small dataset: the shuffle of a validation split then ran 256 map and 256 reduce tasks, 20 s
    for 256 rows of text."""
    rows = max(1, -(-table.num_rows // SYNTHETIC_BLOCKS))
    dataset: ray.data.Dataset = ray.data.from_blocks(
        [table.slice(i, rows) for i in range(0, table.num_rows, rows)]
    )
    return dataset  # (from_blocks is not annotated)


def synthetic_tabular(samples: int, features: int, seed: int) -> ray.data.Dataset:
    """The rows of `synthetic_arrays` as a Ray Dataset with float32 columns x0..x{n-1} and y, built
    column-wise (an Arrow table per block: no Python object per value)."""
    x, y = synthetic_arrays(samples, features, seed)
    return as_blocks(pa.table({**{f"x{j}": x[:, j] for j in range(features)}, LABEL: y}))


def synthetic_text(samples: int, seed: int) -> ray.data.Dataset:
    rng = np.random.default_rng(seed)
    rows = [" ".join(rng.choice(_WORDS, size=int(rng.integers(6, 16)))) for _ in range(samples)]
    return as_blocks(pa.table({TEXT: rows}))


def synthetic_features(config: Mapping[str, Any]) -> int:
    """How many feature columns synthetic tabular data has (`trainer.config.features`, default 8)."""
    return int(config.get("features", 8))


def seed(config: Mapping[str, Any]) -> int:
    """`trainer.config.seed` (default 0): synthetic data and model initialisation."""
    return int(config.get("seed", 0))


@contextlib.contextmanager
def parquet_read_once() -> Iterator[None]:
    """Parquet read as Ray Data's first datasource does (V1): the files are listed (and a few sampled
    for their size) once, when the dataset is made; each pass then only runs the read tasks. Ray
    2.60's default (V2) lists the files again each time the dataset runs, which is every epoch (and
    every validation pass), and reads their footers on a new pool of 32 actors each time: on the
    2-core machine here, 4-7 s per pass over a 512-row file, against 0.2 s. Training reads the same
    files every epoch, so it gains nothing from listing them again."""
    if PARQUET_V2_ENV in os.environ:
        yield
        return
    context = ray.data.DataContext.get_current()
    before, context.use_datasource_v2 = context.use_datasource_v2, False
    try:
        yield
    finally:
        context.use_datasource_v2 = before


def read(uri: str, fmt: str, field: str) -> ray.data.Dataset:
    """The dataset at `uri` in `fmt`; a DataError naming `field` if it cannot be read."""
    fs, path = storage.filesystem(uri)
    try:
        found = fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as err:  # e.g. no credentials for s3://
        raise DataError(f"{field}: cannot read {uri}: {err}") from None
    if not found:
        raise DataError(f"{field}: {uri} does not exist")
    with parquet_read_once():
        return READERS[fmt](uri)


def load(spec: api.DataSpec, *, kind: DataKind, config: Mapping[str, Any]) -> ray.data.Dataset:
    """The training dataset for a TrainingJob's `spec.data`; `config` is `trainer.config`."""
    if spec.source == "synthetic":
        if kind == "text":
            return synthetic_text(spec.samples, seed(config))
        return synthetic_tabular(spec.samples, synthetic_features(config), seed(config))
    return read(data_uri(spec), data_format(spec), "spec.data.uri")


def split(
    dataset: ray.data.Dataset, spec: api.DataSpec, config: Mapping[str, Any]
) -> tuple[ray.data.Dataset, ray.data.Dataset | None]:
    """(training, validation) for `spec.validation`: a seeded `fraction` held out of `dataset`, or
    the data at its `uri`; (dataset, None) without validation."""
    held_out = spec.validation
    if held_out is None:
        return dataset, None
    if held_out.fraction is not None:
        if dataset.count() < 2:
            raise DataError("spec.data.validation.fraction: the training data has fewer than 2 rows to split")
        train, validation = dataset.train_test_split(
            test_size=held_out.fraction, shuffle=True, seed=seed(config)
        )
        return train, validation
    if held_out.uri is None:  # the API requires exactly one of fraction and uri
        raise DataError("spec.data.validation: set fraction or uri")
    fmt = held_out.format or held_out.uri.rsplit(".", 1)[-1]
    return dataset, read(held_out.uri, fmt, "spec.data.validation.uri")


def label(config: Mapping[str, Any]) -> str:
    """The label column: `trainer.config.label`, default `y`."""
    return str(config.get("label", LABEL))


def feature_columns(dataset: ray.data.Dataset, config: Mapping[str, Any]) -> list[str]:
    """`config.features` if it lists columns, else every column but the label."""
    listed = config.get("features")
    if isinstance(listed, list):
        return [str(c) for c in listed]
    target = label(config)
    names = dataset.schema().names
    if target not in names:
        raise DataError(
            f"trainer.config.label: label column {target!r} not in the data (columns: {', '.join(names)}); set trainer.config.label"
        )
    return [c for c in names if c != target]
