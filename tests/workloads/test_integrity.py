"""The checkpoint trust boundary (`integrity`): per-run paths, keyed digests, verify before load.

Unit tests without Ray, then DeepSpeed resume on local Ray: a tampered checkpoint file refuses the
resume with a message naming it; the same checkpoint untampered resumes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from rayship_workloads import integrity, models, recipes

pytestmark = pytest.mark.workloads

RUN = "team-a.job-1"


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(integrity.ENV_KEY_FILE, raising=False)


def signed_checkpoint(root: Path, ranks: int = 2) -> tuple[Path, bytes]:
    """`<root>/<RUN>/epoch-00002` as `ranks` ranks write it (each its own files and digest)."""
    integrity.ensure_key(str(root), RUN)
    key = integrity.load_key(str(root), RUN)
    checkpoint = root / RUN / "epoch-00002"
    for rank in range(ranks):
        part = root / f"rank-{rank}"
        (part / "ds").mkdir(parents=True)
        (part / "ds" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(os.urandom(64))
        if rank == 0:
            (part / "rayship-state.json").write_text('{"epoch": 2}')
        integrity.sign(part, key, run=RUN, name="epoch-00002", rank=rank, world_size=ranks)
        shutil.copytree(part, checkpoint, dirs_exist_ok=True)  # what Ray Train's upload does
    return checkpoint, key


def test_a_signed_checkpoint_verifies(tmp_path: Path) -> None:
    checkpoint, key = signed_checkpoint(tmp_path)
    integrity.verify(checkpoint, key, run=RUN, name="epoch-00002")
    assert sorted(p.name for p in checkpoint.glob("rayship-digest*")) == [
        "rayship-digest.rank-0.json",
        "rayship-digest.rank-1.json",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            "tamper",
            "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt does not match its sha256 in rayship-digest.rank-1.json",
        ),
        ("plant", "ds/zero_pp_rank_7_mp_rank_00_optim_states.pt is in no digest (planted?)"),
        ("symlink", "ds/link.pt is a symlink or special file"),
        ("delete-digest", "digests of ranks [0] do not make a whole checkpoint"),
        ("no-digests", "no rayship-digest*.json"),
        ("re-sign", "rayship-digest.rank-1.json is not signed with this run's key"),
        ("delete-file", "rayship-state.json is missing (listed in rayship-digest.rank-0.json)"),
    ],
)
def test_a_changed_checkpoint_is_refused_naming_the_file(tmp_path: Path, change: str, message: str) -> None:
    checkpoint, key = signed_checkpoint(tmp_path)
    shard = checkpoint / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    if change == "tamper":
        shard.write_bytes(shard.read_bytes() + b"payload")
    elif change == "plant":
        (checkpoint / "ds" / "zero_pp_rank_7_mp_rank_00_optim_states.pt").write_bytes(b"pickle")
    elif change == "symlink":
        (checkpoint / "ds" / "link.pt").symlink_to(tmp_path / "elsewhere.pt")
    elif change == "delete-digest":
        (checkpoint / "rayship-digest.rank-1.json").unlink()
    elif change == "no-digests":
        for digest in checkpoint.glob("rayship-digest*"):
            digest.unlink()
    elif change == "re-sign":  # a co-tenant's own digest over its changed file, with a key of its own
        shard.write_bytes(b"payload")
        doc = json.loads((checkpoint / "rayship-digest.rank-1.json").read_text())
        doc["files"] = {"ds/zero_pp_rank_1_mp_rank_00_optim_states.pt": integrity._sha256(shard)}
        del doc["hmac"]
        doc["hmac"] = integrity._mac(b"k" * 32, doc)
        (checkpoint / "rayship-digest.rank-1.json").write_text(json.dumps(doc))
    elif change == "delete-file":
        (checkpoint / "rayship-state.json").unlink()
    with pytest.raises(integrity.IntegrityError) as err:
        integrity.verify(checkpoint, key, run=RUN, name="epoch-00002")
    assert message in str(err.value) and "\n" not in str(err.value), err.value
    assert str(err.value).endswith("refusing to load it")


def test_another_runs_or_checkpoints_digest_is_refused(tmp_path: Path) -> None:
    checkpoint, key = signed_checkpoint(tmp_path)
    with pytest.raises(
        integrity.IntegrityError, match="is for team-a.job-1/epoch-00002, not team-a.job-1/epoch-00005"
    ):
        integrity.verify(checkpoint, key, run=RUN, name="epoch-00005")  # replayed under another name
    other = integrity.load_key(str(tmp_path), RUN)
    assert other == key  # the same run, the same key
    integrity.ensure_key(str(tmp_path), "team-b.job-1")
    with pytest.raises(integrity.IntegrityError, match="not signed with this run's key"):
        integrity.verify(
            checkpoint, integrity.load_key(str(tmp_path), "team-b.job-1"), run=RUN, name="epoch-00002"
        )


def test_the_key_file_is_private_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    integrity.ensure_key(str(tmp_path), RUN)
    key_file = tmp_path / RUN / integrity.KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    first = integrity.load_key(str(tmp_path), RUN)
    integrity.ensure_key(str(tmp_path), RUN)  # a retry keeps the key
    assert integrity.load_key(str(tmp_path), RUN) == first
    assert integrity.find_key(str(tmp_path), "team-a.other") is None
    with pytest.raises(integrity.IntegrityError, match="checkpoint key is missing"):
        integrity.load_key(str(tmp_path), "team-a.other")
    key_file.chmod(0o644)
    with pytest.raises(integrity.IntegrityError, match="mode 0600 .*found uid .*, mode 644"):
        integrity.load_key(str(tmp_path), RUN)
    key_file.chmod(0o600)
    planted = tmp_path / "team-a.job-2"
    planted.mkdir()
    (planted / integrity.KEY_FILE).symlink_to(key_file)  # a key file that points elsewhere
    with pytest.raises(integrity.IntegrityError, match="cannot read the run's checkpoint key"):
        integrity.load_key(str(tmp_path), "team-a.job-2")
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    monkeypatch.setenv(integrity.ENV_KEY_FILE, str(secret))  # the per-job Secret, when mounted
    from_secret = integrity.load_key(str(tmp_path), RUN)
    assert from_secret != first and from_secret != integrity.load_key(str(tmp_path), "team-a.job-3")


def test_checkpoints_are_read_only_under_the_runs_own_directory(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    (tmp_path / "store" / RUN / "epoch-00001").mkdir(parents=True)
    (tmp_path / "store" / "team-b.job-1" / "epoch-00001").mkdir(parents=True)
    integrity.check_inside(f"{root}/{RUN}/epoch-00001", root, RUN)
    for path in [
        f"{root}/team-b.job-1/epoch-00001",  # another job's
        f"{root}/{RUN}/../team-b.job-1/epoch-00001",
        f"{root}/{RUN}",
        "/etc",
    ]:
        with pytest.raises(integrity.IntegrityError, match="is not under this run's storage"):
            integrity.check_inside(path, root, RUN)
    (tmp_path / "store" / RUN / "epoch-00009").symlink_to(tmp_path / "store" / "team-b.job-1" / "epoch-00001")
    with pytest.raises(integrity.IntegrityError, match="is not under this run's storage"):
        integrity.check_inside(f"{root}/{RUN}/epoch-00009", root, RUN)
    integrity.check_inside("bucket/ckpt/team-a.job-1/epoch-00001", "s3://bucket/ckpt", RUN)
    with pytest.raises(integrity.IntegrityError):
        integrity.check_inside("bucket/ckpt/team-b.job-1/epoch-00001", "s3://bucket/ckpt", RUN)


def exported_mlp(root: Path, *, signed: bool) -> Path:
    model = recipes.MLP(4, [8])
    directory = models.export(
        root / RUN / "model", "mlp", recipes.ModelSetup({"in_features": 4, "hidden": [8]}), model.state_dict()
    )
    if signed:
        integrity.ensure_key(str(root), RUN)
        integrity.sign(directory, integrity.load_key(str(root), RUN), run=RUN, name="model", model=True)
    return directory


def test_models_load_verifies_the_digest(tmp_path: Path) -> None:
    directory = exported_mlp(tmp_path, signed=True)
    model, manifest = models.load_model(str(directory))
    assert manifest["recipe"] == "mlp"
    weights = directory / recipes.MLP_WEIGHTS
    state = torch.load(weights, weights_only=True)
    state["net.0.bias"] += 1
    torch.save(state, weights)
    with pytest.raises(
        integrity.IntegrityError, match=r"model .*: model.pt does not match its sha256 in rayship-digest.json"
    ):
        models.load(str(directory))
    copy = tmp_path / "elsewhere" / "model"  # copied away from its run's key: the sha256s still hold
    shutil.copytree(directory, copy)
    with pytest.raises(integrity.IntegrityError, match="model.pt does not match"):
        models.load(str(copy))


def test_a_model_of_a_signing_run_needs_its_digest(tmp_path: Path) -> None:
    directory = exported_mlp(tmp_path, signed=True)
    (directory / integrity.MODEL_DIGEST).unlink()
    with pytest.raises(integrity.IntegrityError, match="no rayship-digest"):
        models.load(str(directory))
    unsigned = exported_mlp(tmp_path / "old", signed=False)  # before digests, and no key: as before
    assert models.load(str(unsigned))[1]["recipe"] == "mlp"


# --- on local Ray ---------------------------------------------------------------------------------


JOB = "team-a.tuned"


def handed_copy(root: Path, signer: str, trial_dir: str = "b1c2d_00001") -> Path:
    """A checkpoint `signer` wrote (`<root>/<signer>/epoch-00002`), as Tune copies it into the job's
    results for PBT (`<root>/<JOB>-tune/<trial>/checkpoint_000001`)."""
    integrity.ensure_key(str(root), signer)
    written = root / signer / "epoch-00002"
    written.mkdir(parents=True)
    (written / "state.pt").write_bytes(os.urandom(64))
    integrity.sign(written, integrity.load_key(str(root), signer), run=signer, name="epoch-00002")
    copy = root / f"{JOB}-tune" / trial_dir / "checkpoint_000001"
    shutil.copytree(written, copy)
    return copy


def test_a_trial_verifies_the_checkpoint_another_trial_of_its_job_hands_it(tmp_path: Path) -> None:
    """PBT: trial b1c2d_00000 resumes from Tune's copy of trial b1c2d_00001's checkpoint, checked
    with the key of the run that signed it (each trial keeps its own key)."""
    donor = f"{JOB}-b1c2d_00001"
    copy = handed_copy(tmp_path, donor)
    results = str(tmp_path / f"{JOB}-tune")
    signed = integrity.verify_handoff(
        copy, str(copy), storage_root=str(tmp_path), job_run=JOB, results=results
    )
    assert signed == f"{donor}/epoch-00002"
    # a restarted trial's segment run (after an earlier hand-off) is a trial of the job too
    assert integrity.is_trial_run(f"{JOB}-b1c2d_00001-0f106fe5", JOB)


@pytest.mark.parametrize(
    ("signer", "message"),
    [
        # another TrainingJob's run (job names have no underscore, Tune's trial ids do)
        ("team-a.tuned-other", "signed as team-a.tuned-other/epoch-00002, not by a trial of team-a.tuned"),
        ("team-a.tuned-tune-b1c2d_00001", "not by a trial of team-a.tuned"),
        ("team-b.tuned-b1c2d_00001", "not by a trial of team-a.tuned"),
    ],
)
def test_a_handed_checkpoint_not_signed_by_a_trial_of_the_job_is_refused(
    tmp_path: Path, signer: str, message: str
) -> None:
    copy = handed_copy(tmp_path, signer)
    with pytest.raises(integrity.IntegrityError, match=message):
        integrity.verify_handoff(
            copy, str(copy), storage_root=str(tmp_path), job_run=JOB, results=str(tmp_path / f"{JOB}-tune")
        )


def test_a_handed_checkpoint_is_still_verified_file_by_file(tmp_path: Path) -> None:
    """Signed by a trial of the job, but changed in Tune's copy, or forged with another key, or
    outside the job's Tune results: refused."""
    donor = f"{JOB}-b1c2d_00001"
    copy = handed_copy(tmp_path, donor)
    results = str(tmp_path / f"{JOB}-tune")
    (copy / "state.pt").write_bytes(b"planted")
    with pytest.raises(integrity.IntegrityError, match="state.pt does not match its sha256"):
        integrity.verify_handoff(copy, str(copy), storage_root=str(tmp_path), job_run=JOB, results=results)

    forged = tmp_path / f"{JOB}-tune" / "b1c2d_00002" / "checkpoint_000001"
    shutil.copytree(handed_copy(tmp_path / "forger", donor), forged)  # signed with another key
    with pytest.raises(integrity.IntegrityError, match="not signed with this run's key"):
        integrity.verify_handoff(
            forged, str(forged), storage_root=str(tmp_path), job_run=JOB, results=results
        )

    elsewhere = tmp_path / "elsewhere" / "x" / "checkpoint_000001"
    shutil.copytree(handed_copy(tmp_path / "other", donor), elsewhere)
    with pytest.raises(integrity.IntegrityError, match="is not under"):
        integrity.verify_handoff(
            elsewhere, str(elsewhere), storage_root=str(tmp_path), job_run=JOB, results=results
        )


def test_deepspeed_resume_refuses_a_tampered_checkpoint_and_resumes_an_untampered_one(
    ray_session: None, tmp_path: Path
) -> None:
    from rayship_workloads import train
    from tests.workloads.test_train import spec

    store = tmp_path / "store"

    def run(epochs: int) -> train.Outcome:
        tj = spec(
            tmp_path,
            **{
                "trainer.strategy": "deepspeed",
                "trainer.deepspeed": {"zeroStage": 2},
                "trainer.epochs": epochs,
            },
        )
        return train.train(tj, storage_root=str(store), quiet=True)

    first = run(2)
    assert first.latest is not None and first.latest.endswith("default.mlp-ddp/epoch-00002")
    latest = Path(first.latest)
    assert {p.name for p in latest.glob("rayship-digest*")} == {
        "rayship-digest.rank-0.json",
        "rayship-digest.rank-1.json",
    }
    assert (Path(first.model_uri or "") / integrity.MODEL_DIGEST).is_file()
    shard = sorted(latest.glob("ds/*optim_states.pt"))[-1]  # unpickled with weights_only=False on resume
    original = shard.read_bytes()
    shard.write_bytes(original + b"planted")

    with pytest.raises(Exception) as err:  # noqa: PT011 - Ray wraps the worker's IntegrityError
        run(3)
    relative = shard.relative_to(latest).as_posix()
    assert f"{latest}: {relative} does not match its sha256 in rayship-digest.rank-" in str(err.value), (
        err.value
    )

    shard.write_bytes(original)
    resumed = run(3)
    assert resumed.metrics["epoch"] == 3 and resumed.metrics["resumed_from_epoch"] == 2
