"""What `rayship get` prints, as kubectl prints it: the table's columns are the CRD's printer columns
(api.KINDS; -o wide adds those of priority > 0), each cell read at its jsonPath, dates as kubectl's ages;
-o name, -o json and -o yaml as kubectl's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from rayship import api
from rayship.cli import get, output

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def trainingjob(name: str, **status: object) -> dict:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "team-a", "creationTimestamp": "2026-12-05T11:55:00Z"},
        "spec": {"workers": {"replicas": 2}},
        "status": status,
    }


def test_every_printer_column_path_of_every_kind_is_supported() -> None:
    """The dotted-path evaluator covers every jsonPath the CRDs declare (it refuses anything else)."""
    for kind in api.KINDS:
        for column in kind.columns:
            obj: dict = {}
            leaf = obj
            *parents, last = column.json_path.split(".")[1:]
            for key in parents:
                leaf = leaf.setdefault(key, {})
            leaf[last] = "here"
            assert output.at_path(obj, column.json_path) == "here", (kind.kind, column.json_path)
            assert output.at_path({}, column.json_path) is None
    with pytest.raises(ValueError, match="only dotted field paths"):
        output.at_path({}, ".status.conditions[?(@.type=='Ready')].status")


def test_the_table_has_the_crds_columns_and_wide_adds_the_rest() -> None:
    kind = api.TRAINING_JOB
    items = [
        trainingjob(
            "mlp", phase="Running", readyWorkers=2, gpus=2, progress={"epoch": 3, "metrics": {"loss": 0.25}}
        ),
        trainingjob("b", phase="Failed", lastError={"message": "CUDA out of memory"}),
    ]
    table = output.table(kind, items, wide=False, namespaces=False, now=NOW).splitlines()
    assert table[0].split() == [
        "NAME",
        "PHASE",
        "WORKERS",
        "READY",
        "GPUS",
        "EPOCH",
        "LOSS",
        "GPU-HOURS",
        "AGE",
    ]
    assert table[0].split() == ["NAME"] + [c.name.upper() for c in kind.columns if not c.priority]
    assert table[1].split() == ["mlp", "Running", "2", "2", "2", "3", "0.25", "5m"]
    assert table[2].split() == ["b", "Failed", "2", "5m"]  # unset fields are empty cells
    assert table[1].index("Running") == table[0].index("PHASE")  # aligned
    wide = output.table(kind, items, wide=True, namespaces=True, now=NOW).splitlines()
    assert wide[0].split()[:2] == ["NAMESPACE", "NAME"] and wide[0].endswith("LAST ERROR")
    assert wide[2].startswith("team-a") and wide[2].endswith("CUDA out of memory")


@pytest.mark.parametrize(
    ("seconds", "age"),
    [(-5, "<invalid>"), (0, "0s"), (119, "119s"), (120, "2m"), (200, "3m20s"), (900, "15m"),
     (3 * 3600 + 600, "3h10m"), (9 * 3600, "9h"), (50 * 3600, "2d2h"), (20 * 86400, "20d"),
     (800 * 86400, "2y70d"), (3650 * 86400, "10y")],
)  # fmt: skip
def test_ages_are_kubectls(seconds: int, age: str) -> None:
    assert output.human_duration(seconds) == age
    assert output.age((NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ"), NOW) == age


def test_cells_are_kubectls() -> None:
    assert output.cell(None, "string", NOW) == ""
    assert output.cell(True, "boolean", NOW) == "true"
    assert output.cell(0.5, "number", NOW) == "0.5"
    assert output.cell("2026-12-05T11:00:00Z", "date", NOW) == "60m"


def test_name_json_and_yaml_outputs_are_kubectls() -> None:
    items = [trainingjob("mlp"), trainingjob("b")]
    kind = api.TRAINING_JOB
    assert get.render(kind, items, "name", False, False) == (
        "trainingjob.rayship.dev/mlp\ntrainingjob.rayship.dev/b\n"
    )
    listed = json.loads(get.render(kind, items, "json", False, False))
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["mlp", "b"]
    assert json.loads(get.render(kind, items[:1], "json", True, False)) == items[0]  # one named: itself
    assert yaml.safe_load(get.render(kind, items[:1], "yaml", True, False)) == items[0]
    multi = trainingjob("m", lastError={"message": "line one\nline two"})
    assert "message: |-\n" in output.dump([multi], "yaml", True)  # multi-line strings stay readable
