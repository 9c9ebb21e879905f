"""Ray Tune's PBT (`spec.tuning.scheduler: pbt`): mutations from the search space, kept inside it,
and a real checkpoint hand-off between trials through `rayship run -f`, with readable progress."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ray.tune.schedulers import PopulationBasedTraining

from rayship import api
from rayship_workloads import tune
from tests.conftest import ROOT

pytestmark = pytest.mark.workloads

PBT_EXAMPLE = ROOT / "examples" / "tune-pbt" / "trainingjob.yaml"


def tuning(**fields: object) -> api.TuningSpec:
    return api.TuningSpec.model_validate(
        {
            "scheduler": "pbt",
            "numSamples": 2,
            "maxConcurrentTrials": 4,  # the population: 2 samples x 2 grid values
            "searchSpace": {
                "learningRate": {"distribution": "loguniform", "low": 1e-4, "high": 1e-2},
                "batchSizePerWorker": {"distribution": "randint", "low": 8, "high": 64},
                "config.hidden": {"distribution": "grid", "values": [[16], [32]]},
                "config.dropout": {"distribution": "choice", "values": [0.0, 0.1]},
            },
            **fields,
        }
    )


def test_pbt_mutations_come_from_the_search_space_and_its_knobs_reach_tune() -> None:
    spec = tuning(
        pbt={
            "perturbationInterval": 2,
            "quantileFraction": 0.5,
            "resampleProbability": 0.1,
            "synchronous": True,
        },
    )
    found = tune.mutations(spec)
    assert found["config.hidden"] == [[16], [32]] and found["config.dropout"] == [0.0, 0.1]
    assert (found["learningRate"].lower, found["learningRate"].upper) == (1e-4, 1e-2)
    scheduler = tune.scheduler(spec, epochs=6)
    assert isinstance(scheduler, PopulationBasedTraining)
    assert scheduler._perturbation_interval == 2 and scheduler._time_attr == "epoch"
    assert (scheduler._quantile_fraction, scheduler._resample_probability, scheduler._synch) == (
        0.5,
        0.1,
        True,
    )
    assert set(scheduler._hyperparam_mutations) == set(spec.search_space)


def test_pbt_leaves_the_last_epoch_alone() -> None:
    """An exploit at the last epoch would restart the trial only to finish at once (and Tune would
    replace its result log with the donor's): the last epoch's result passes PBT by; earlier ones
    reach it (it records the trial's score)."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers.pbt import _PBTTrialState

    scheduler = tune.scheduler(tuning(pbt={"perturbationInterval": 1}), epochs=3)
    scheduler.set_search_properties("loss", "min")
    trial = Trial("trial", config={"learningRate": 0.01}, stub=True)
    scheduler._trial_state[trial] = state = _PBTTrialState(trial)
    controller = SimpleNamespace(get_trials=lambda: [trial], get_live_trials=lambda: [trial])
    assert scheduler.on_trial_result(controller, trial, {"epoch": 3, "loss": 0.5}) == "CONTINUE"
    assert state.last_score is None and state.last_perturbation_time == 0
    scheduler.on_trial_result(controller, trial, {"epoch": 2, "loss": 0.7})
    assert state.last_score == -0.7 and state.last_perturbation_time == 2


def test_pbt_mutations_stay_inside_their_ranges() -> None:
    """PBT scales a value by 0.8 or 1.2: `clip` brings it back into [low, high] ([low, high) for randint)."""
    bounds = tune.ranges(tuning())
    assert tune.clip(bounds, {"learningRate": 1.2e-2, "batchSizePerWorker": 76.8, "config.hidden": [16]}) == {
        "learningRate": 1e-2,
        "batchSizePerWorker": 63,
        "config.hidden": [16],
    }
    assert tune.clip(bounds, {"learningRate": 0.8e-4, "batchSizePerWorker": 6.4}) == {
        "learningRate": 1e-4,
        "batchSizePerWorker": 8,
    }
    assert tune.clip(bounds, {"learningRate": 5e-3, "batchSizePerWorker": 20.4}) == {
        "learningRate": 5e-3,
        "batchSizePerWorker": 20,
    }


def test_a_trial_restarted_from_a_checkpoint_trains_in_a_new_run() -> None:
    """Ray Train would resume a trial's earlier run by its name: a restart from a handed checkpoint
    gets its own, the same for the same checkpoint."""
    run = "default.job-b1c2d_00000"
    assert tune.segment_name(run, None) == run
    one = tune.segment_name(run, "/s/default.job-tune/b1c2d_00001/checkpoint_000002")
    assert one.startswith(f"{run}-") and len(one) == len(run) + 9
    assert one == tune.segment_name(run, "/s/default.job-tune/b1c2d_00001/checkpoint_000002")
    assert one != tune.segment_name(run, "/s/default.job-tune/b1c2d_00001/checkpoint_000003")


def test_trial_progress_is_a_line_per_report_and_per_hand_off() -> None:

    lines: list[str] = []
    callback = tune.TrialLines(metric="evalLoss", epochs=4, say=lines.append)
    trial = SimpleNamespace(trial_id="b1c2d_00000", config={"learningRate": 0.001234567})
    callback.on_trial_result(1, [], trial, {"epoch": 1, "loss": 0.5, "evalLoss": 0.25, "step": 8})
    handed = {"epoch": 3, "loss": 0.2, "handed_from": "default.job-b1c2d_00001/epoch-00002"}
    callback.on_trial_result(2, [], trial, handed)
    callback.on_trial_result(3, [], trial, {**handed, "epoch": 4})  # the same hand-off: said once
    own = {"epoch": 2, "loss": 0.4, "handed_from": "default.job-b1c2d_00000/epoch-00001"}
    callback.on_trial_result(4, [], trial, own)
    assert lines == [
        "trial b1c2d_00000  epoch 1/4  loss 0.50000  evalLoss 0.25000  learningRate=0.001235",
        "trial b1c2d_00000  exploits default.job-b1c2d_00001/epoch-00002 (PBT): now learningRate=0.001235",
        "trial b1c2d_00000  epoch 3/4  loss 0.20000  learningRate=0.001235",
        "trial b1c2d_00000  epoch 4/4  loss 0.20000  learningRate=0.001235",
        "trial b1c2d_00000  resumed from its checkpoint default.job-b1c2d_00000/epoch-00001",
        "trial b1c2d_00000  epoch 2/4  loss 0.40000  learningRate=0.001235",
    ]


def test_pbt_hands_the_better_trials_checkpoint_to_the_worse_one(ray_session, tmp_path: Path, capsys) -> None:
    """Two trials (a learning rate that learns, one that barely moves), perturbed every epoch: the
    worse trial resumes from the better trial's checkpoint (its state verified and loaded: its next
    loss is the better trial's, not its own), which Tune's results and the progress lines show.
    Slow (~100 s on 2 cores): every pause and hand-off starts a new Ray Train run."""
    from rayship import cli

    # examples/tune-pbt as shipped: two trials (learning rates 1e-5 and 3e-2), perturbed every epoch,
    # synchronous (asynchronous, the first trial to start can finish before the other's second epoch,
    # leaving nothing to hand over)
    path, runs = PBT_EXAMPLE, tmp_path / "runs"
    assert cli.main(["run", "-f", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    results = runs / "pbt" / "checkpoints" / "pbt-tune"
    reports = {
        trial.name: [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        for trial in results.iterdir()
        if trial.is_dir()
    }
    assert len(reports) == 2, out
    exploits = [
        (trial, report)
        for trial, records in reports.items()
        for report in records
        if report.get("handed_from") and f"-{trial}" not in report["handed_from"].split("/")[0]
    ]
    assert exploits, out
    trial, report = exploits[0]
    (donor,) = set(reports) - {trial}
    donor_run, donor_checkpoint = report["handed_from"].split("/")
    assert donor_run.startswith(f"pbt-{donor}")
    donor_epoch = int(donor_checkpoint.removeprefix("epoch-"))
    assert report["resumed_from_epoch"] == donor_epoch and report["epoch"] == donor_epoch + 1
    # The donor's own record of that epoch is gone when the donor was itself restarted later (Tune
    # rewrites a restarted trial's result log; seen once with a second exploit): then only the
    # trial's own first loss bounds it.
    donor_losses = [r["loss"] for r in reports[donor] if r["epoch"] == donor_epoch]
    donor_loss = donor_losses[0] if donor_losses else float("inf")
    # its own first epoch, as the progress lines said it (Tune rewrites an exploited trial's result log)
    own = re.search(rf"^trial {trial}  epoch 1/2  loss ([0-9.]+)", out, re.MULTILINE)
    assert own is not None, out
    own_loss = float(own.group(1))
    assert report["loss"] < 0.5 * own_loss and report["loss"] < 2 * donor_loss, (report, own_loss, donor_loss)
    # readable progress: a line per trial epoch and one per exploit, no Tune status table
    assert f"trial {trial}  exploits {report['handed_from']} (PBT): now learningRate=" in out, out
    assert f"trial {donor}  epoch 1/2  loss " in out and "Trial status" not in out
    result = json.loads((runs / "pbt" / "result.json").read_text())
    assert result["tuning"]["trials"] == 2 and result["model"]


def test_asha_knobs_reach_tune_in_epochs() -> None:
    """tuning.asha's maxT, gracePeriod and reductionFactor are ASHA's, counted in epochs (its rungs:
    gracePeriod x reductionFactor^k below maxT); maxT defaults to trainer.epochs."""
    spec = api.TuningSpec.model_validate(
        {
            "scheduler": "asha",
            "asha": {"maxT": 9, "gracePeriod": 2, "reductionFactor": 3},
            "searchSpace": {"learningRate": {"distribution": "loguniform", "low": 1e-4, "high": 1e-2}},
        }
    )
    asha = tune.scheduler(spec, epochs=20)
    (bracket,) = asha._brackets
    assert (asha._time_attr, asha._max_t, bracket.rf) == ("epoch", 9, 3)
    assert [milestone for milestone, _ in bracket._rungs] == [6, 2]
    default = tune.scheduler(spec.model_copy(update={"asha": None}), epochs=20)
    assert default._max_t == 20


def test_asha_stops_a_bad_trial_at_its_first_rung_while_the_good_one_trains_on(
    ray_session, tmp_path: Path, capsys
) -> None:
    """ASHA seen at work, not in its attributes: rungs at epochs 1 and 2 (gracePeriod 1, reductionFactor
    2, maxT 4). The learning rate that learns runs first (one trial at a time, the grid in order) and
    trains all 4 epochs; the one that barely moves is worse at epoch 1 than the first was there, and
    is stopped right after it."""
    from rayship import cli

    doc = yaml.safe_load(PBT_EXAMPLE.read_text())
    doc["metadata"]["name"] = "asha"
    doc["spec"]["trainer"]["epochs"] = 4
    doc["spec"]["tuning"] = {
        "numSamples": 1,
        "maxConcurrentTrials": 1,
        "scheduler": "asha",
        "asha": {"gracePeriod": 1, "reductionFactor": 2},
        "searchSpace": {"learningRate": {"distribution": "grid", "values": [0.03, 0.00001]}},
    }
    path, runs = tmp_path / "asha.yaml", tmp_path / "runs"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["run", "-f", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    results = runs / "asha" / "checkpoints" / "asha-tune"
    epochs = {}
    for trial in (t for t in results.iterdir() if t.is_dir()):
        records = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        epochs[records[0]["config"]["learningRate"]] = [r["epoch"] for r in records]
    assert epochs == {0.03: [1, 2, 3, 4], 0.00001: [1]}, (epochs, out)
    result = json.loads((runs / "asha" / "result.json").read_text())
    assert result["tuning"]["trials"] == 2 and result["model"], result
