"""Checkpoint and model integrity: what rayship loads from shared storage, it wrote itself.

Trust boundary. Checkpoint storage (a PVC or an object-store prefix) may be shared with other jobs,
and DeepSpeed's resume and ZeRO consolidation unpickle (`torch.load(weights_only=False)`) what they
find: a file another job planted there would run its code in this job. So:

- Paths: a run reads checkpoints only directly under `<storage>/<run name>/` (run name
  `<namespace>.<name>`; a namespace has no dots, so two jobs never share one), resolved, symlinks
  refused (`check_inside`): not wherever Ray Train's or Tune's saved state says.
- Digests: every rank that saves a checkpoint writes, last, `rayship-digest.rank-<N>.json` (an
  exported model: `rayship-digest.json`): the sha256 of each file it wrote, the run name, the
  checkpoint's name, the world size, and an HMAC-SHA256 of all that under the run's key (`sign`).
- Verify before load (`verify`): before resuming (`recipes.resume`), consolidating a checkpoint
  (`train.export`) or serving a model (`models.load`), every file of the directory must be covered by a
  digest with a valid HMAC, of this run and this checkpoint name, one digest per rank; a missing digest,
  an extra or changed file, a symlink or a bad HMAC refuses the load with one line naming the file.
  `models.load` verifies a model that has a digest, and without the key checks the sha256s only.

The key: HMAC-SHA256(secret, "rayship-digest/v1" + run name), the secret being, in order,
- the file named by `RAYSHIP_CHECKPOINT_KEY_FILE` (meant for a per-TrainingJob Secret the operator
  creates once and mounts in every Ray pod: stable across RayJob retries, readable only in the job's
  namespace; the operator does not do this yet);
- else `<storage>/<run name>/.rayship-key`: 32 random bytes the driver creates at the run's first
  attempt (`ensure_key`), mode 0600, refused if it is a symlink, not this user's, or readable by others.

Limits, said plainly: the key file keeps out other *users* (uids); a job running as the same uid on
the same volume can read it and forge digests, and on an object store the key object is as private as
the bucket. Only the Secret (`RAYSHIP_CHECKPOINT_KEY_FILE`) separates jobs that share a uid and storage.
The digest does not stop a co-tenant deleting or replacing checkpoints (the load then refuses), nor
replaying this run's own older checkpoint under its own name.

Hand-off between the trials of one search (Tune PBT, `verify_handoff`): each trial is its own Train
run `<job run>-<Tune trial id>[-<segment>]` with its own key, as above. A trial that exploits another
resumes from Tune's copy of that trial's checkpoint, which must lie in the job's Tune results
(`<storage>/<job run>-tune/<trial>/<checkpoint>/`) and be signed by a Train run of the *same* job (a
Tune trial id holds an underscore, which no Kubernetes name has, so no other TrainingJob's run matches)
with that run's own key (`find_key`: its key file, or the shared secret derived for that run name). No
key is shared or weakened: a checkpoint from outside the job, or signed by anything but one of its
trials, is refused as before. The copy's directory name is Tune's, so the name checked is the one the
trial signed (`epoch-NNNNN`): as above, replaying the job's own older checkpoints is not prevented.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import posixpath
import re
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from rayship_workloads import storage

log = logging.getLogger("rayship.integrity")

FORMAT = "rayship-digest/v1"
KEY_FILE = ".rayship-key"
ENV_KEY_FILE = "RAYSHIP_CHECKPOINT_KEY_FILE"
MODEL_DIGEST = "rayship-digest.json"
DIGEST_GLOB = "rayship-digest*.json"
SECRET_BYTES = 32


class IntegrityError(RuntimeError):
    """A checkpoint or model that rayship will not load: one line naming the file."""


def rank_digest(rank: int) -> str:
    return f"rayship-digest.rank-{rank}.json"


# --- the key ----------------------------------------------------------------------------------------


def _derive(secret: bytes, run_name: str) -> bytes:
    return hmac.new(secret, f"{FORMAT}\0{run_name}".encode(), hashlib.sha256).digest()


def _env_secret() -> bytes | None:
    path = os.environ.get(ENV_KEY_FILE)
    if not path:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as err:
        raise IntegrityError(f"{ENV_KEY_FILE}={path}: cannot read the checkpoint key: {err}") from err
    if len(secret) < 16:
        raise IntegrityError(f"{ENV_KEY_FILE}={path}: the checkpoint key is shorter than 16 bytes")
    return secret


def _read_local_secret(path: Path) -> bytes:
    """The key file's bytes, if it is a regular file of this user's that no one else may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise IntegrityError(f"{path}: cannot read the run's checkpoint key: {err.strerror}") from err
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise IntegrityError(
                f"{path}: the run's checkpoint key must be a file of uid {os.geteuid()} with mode 0600 "
                f"(found uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); refusing to trust it"
            )
        secret = f.read()
    if len(secret) != SECRET_BYTES:
        raise IntegrityError(
            f"{path}: the run's checkpoint key is not {SECRET_BYTES} bytes; refusing to trust it"
        )
    return secret


def _create_local_secret(path: Path) -> None:
    """Write a new secret to `path` (0600) unless it exists: written aside, then linked into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".rayship-key-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(SECRET_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use theirs (it is checked when read)
    finally:
        os.unlink(tmp)


def _key_uri(storage_root: str, run_name: str) -> str:
    return storage.join(storage_root, run_name, KEY_FILE)


def ensure_key(storage_root: str, run_name: str) -> None:
    """Create the run's key at its first attempt (the driver, before any worker saves or loads)."""
    if _env_secret() is not None:
        return
    uri = _key_uri(storage_root, run_name)
    if not storage.is_remote(uri):
        path = Path(uri.removeprefix("file://"))
        if not path.exists() and not path.is_symlink():
            _create_local_secret(path)
        _read_local_secret(path)  # checked now, not at the first checkpoint
        return
    fs, key_path = storage.filesystem(uri)
    import pyarrow.fs as pafs

    if fs.get_file_info(key_path).type == pafs.FileType.NotFound:
        fs.create_dir(posixpath.dirname(key_path), recursive=True)
        with fs.open_output_stream(key_path) as out:
            out.write(secrets.token_bytes(SECRET_BYTES))


def load_key(storage_root: str, run_name: str) -> bytes:
    """The run's HMAC key (see the module docstring); IntegrityError if there is none or it is unsafe."""
    key = find_key(storage_root, run_name)
    if key is None:
        raise IntegrityError(
            f"{_key_uri(storage_root, run_name)}: the run's checkpoint key is missing; "
            "its checkpoints cannot be verified and will not be loaded"
        )
    return key


def find_key(storage_root: str, run_name: str) -> bytes | None:
    """The run's HMAC key, or None if no secret exists for it."""
    secret = _env_secret()
    if secret is None:
        uri = _key_uri(storage_root, run_name)
        if not storage.is_remote(uri):
            path = Path(uri.removeprefix("file://"))
            if not path.exists() and not path.is_symlink():
                return None
            secret = _read_local_secret(path)
        else:
            fs, key_path = storage.filesystem(uri)
            try:
                with fs.open_input_stream(key_path) as f:
                    secret = f.read()
            except FileNotFoundError:
                return None
    return _derive(secret, run_name)


# --- paths --------------------------------------------------------------------------------------------


def check_inside(path: str, storage_root: str, run_name: str) -> None:
    """`path` (a checkpoint directory as Ray Train names it) must be a directory directly under
    `<storage_root>/<run_name>/`, after resolving `..` and (locally) symlinks."""
    run_dir = storage.join(storage_root, run_name)
    if storage.is_remote(run_dir):
        base = run_dir.split("://", 1)[1]  # pyarrow's path in an object store: bucket/prefix
        inner = path.split("://", 1)[1] if "://" in path else path
        parent = posixpath.dirname(posixpath.normpath(inner))
        inside = parent == posixpath.normpath(base)
    else:
        resolved = Path(os.path.realpath(path.removeprefix("file://")))
        inside = resolved.parent == Path(os.path.realpath(run_dir))
    if not inside:
        raise IntegrityError(
            f"checkpoint {path} is not under this run's storage {run_dir}/; refusing to load it"
        )


def check_within(path: str, directory: str, depth: int) -> None:
    """`path` must be `depth` levels under `directory` (`check_inside`'s rule, `depth` levels down)."""
    if storage.is_remote(directory):
        inner = path.split("://", 1)[1] if "://" in path else path
        parent, base = posixpath.normpath(inner), posixpath.normpath(directory.split("://", 1)[1])
        for _ in range(depth):
            parent = posixpath.dirname(parent)
        inside = parent == base
    else:
        resolved = Path(os.path.realpath(path.removeprefix("file://")))
        inside = resolved.parents[depth - 1] == Path(os.path.realpath(directory))
    if not inside:
        raise IntegrityError(f"checkpoint {path} is not under {directory}/; refusing to load it")


# --- digests --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> dict[str, Path]:
    """Every file under `directory` but the digests, by relative POSIX path; symlinks and other
    non-regular entries refused."""
    found: dict[str, Path] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise IntegrityError(f"{directory}: {rel} is a symlink or special file; refusing to load it")
        if path.is_file() and not (path.parent == directory and path.match(DIGEST_GLOB)):
            found[rel] = path
    return found


def _mac(key: bytes, payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def sign(
    directory: Path,
    key: bytes,
    *,
    run: str,
    name: str,
    rank: int = 0,
    world_size: int = 1,
    model: bool = False,
) -> Path:
    """Write the digest of every file in `directory` (this rank's part of checkpoint `name` of `run`,
    or an exported model), last; its path."""
    payload = {
        "format": FORMAT,
        "run": run,
        "checkpoint": name,
        "rank": rank,
        "world_size": world_size,
        "files": {rel: _sha256(path) for rel, path in _files(directory).items()},
    }
    target = directory / (MODEL_DIGEST if model else rank_digest(rank))
    target.write_text(json.dumps({**payload, "hmac": _mac(key, payload)}, indent=1, sort_keys=True))
    return target


def has_digest(directory: Path) -> bool:
    return any(directory.glob(DIGEST_GLOB))


def verify(directory: Path, key: bytes | None, *, run: str, name: str, what: str = "checkpoint") -> None:
    """Refuse (IntegrityError, one line naming the file) unless every file of `directory` is covered
    by a digest of checkpoint `name` of `run`, one per rank, with a valid HMAC under `key` (`key`
    None: the sha256s only, and not whose digest it is, for a model whose run's key is not here)."""
    digests = sorted(directory.glob(DIGEST_GLOB))
    if not digests:
        raise IntegrityError(
            f"{what} {directory}: no {DIGEST_GLOB} (not written by this run, or before digests); refusing to load it"
        )
    files = _files(directory)
    expected: dict[str, tuple[str, str]] = {}  # rel -> (sha256, digest file)
    ranks: set[int] = set()
    world_sizes: set[int] = set()
    for digest in digests:
        try:
            doc = json.loads(digest.read_text())
            payload = {k: doc[k] for k in ("format", "run", "checkpoint", "rank", "world_size", "files")}
            mac = str(doc["hmac"])
        except (ValueError, KeyError, TypeError) as err:
            raise IntegrityError(
                f"{what} {directory}: {digest.name} is not a rayship digest ({err}); refusing to load it"
            ) from err
        if key is not None and not hmac.compare_digest(mac, _mac(key, payload)):
            raise IntegrityError(
                f"{what} {directory}: {digest.name} is not signed with this run's key (tampered, or another job's); "
                "refusing to load it"
            )
        mismatch = payload["run"] != run or payload["checkpoint"] != name
        if payload["format"] != FORMAT or (key is not None and mismatch):
            raise IntegrityError(
                f"{what} {directory}: {digest.name} is for {payload['run']}/{payload['checkpoint']}, "
                f"not {run}/{name}; refusing to load it"
            )
        ranks.add(int(payload["rank"]))
        world_sizes.add(int(payload["world_size"]))
        for rel, sha in dict(payload["files"]).items():
            if rel in expected and expected[rel][0] != sha:
                raise IntegrityError(f"{what} {directory}: {rel}: the digests disagree; refusing to load it")
            expected[rel] = (str(sha), digest.name)
    if len(world_sizes) != 1 or ranks != set(range(world_sizes.pop())):
        raise IntegrityError(
            f"{what} {directory}: digests of ranks {sorted(ranks)} do not make a whole checkpoint; refusing to load it"
        )
    for rel in sorted(files.keys() - expected.keys()):
        raise IntegrityError(f"{what} {directory}: {rel} is in no digest (planted?); refusing to load it")
    for rel, (sha, digest_name) in sorted(expected.items()):
        if rel not in files:
            raise IntegrityError(
                f"{what} {directory}: {rel} is missing (listed in {digest_name}); refusing to load it"
            )
        if _sha256(files[rel]) != sha:
            raise IntegrityError(
                f"{what} {directory}: {rel} does not match its sha256 in {digest_name} (tampered or damaged); "
                "refusing to load it"
            )


def verify_model(uri: str, directory: Path) -> None:
    """Verify an exported model (`uri`, fetched to `directory`) before it is loaded. Its run's key is
    looked for where `train.export` puts models, `<storage>/<run name>/<model>`: with a key, a digest
    is required and must be signed with it; without one, a digest present is checked (sha256s)."""
    base = uri.rstrip("/")
    if storage.is_remote(base):
        run_dir = posixpath.dirname(base)
        storage_root, run_name = posixpath.dirname(run_dir), posixpath.basename(run_dir)
    else:
        resolved = Path(os.path.realpath(base.removeprefix("file://")))
        storage_root, run_name = str(resolved.parent.parent), resolved.parent.name
    key = find_key(storage_root, run_name) if run_name else None
    if key is not None:
        verify(directory, key, run=run_name, name=posixpath.basename(base), what="model")
    elif has_digest(directory):
        log.warning("model %s: no key of its run here: checking its files' sha256s, not who wrote them", uri)
        verify(directory, None, run=run_name, name=posixpath.basename(base), what="model")


# --- hand-off between the trials of one search ------------------------------------------------------

_TRIAL_SUFFIX = re.compile(r"-[0-9a-f]{5}_[0-9]{5}(-[0-9a-f]{8})?")


def is_trial_run(run: str, job_run: str) -> bool:
    """`run` is the Train run of a Tune trial of the job whose run name is `job_run`:
    `<job run>-<trial id>` (Tune's ids: 5 hex digits, `_`, 5 digits), after a hand-off with a segment
    `-<8 hex digits>`."""
    return run.startswith(f"{job_run}-") and _TRIAL_SUFFIX.fullmatch(run[len(job_run) :]) is not None


def _signer(directory: Path) -> tuple[str, str]:
    """(run, checkpoint) the digests of `directory` claim (checked against the HMAC by `verify`)."""
    claims = set()
    for digest in sorted(directory.glob(DIGEST_GLOB)):
        try:
            doc = json.loads(digest.read_text())
            claims.add((str(doc["run"]), str(doc["checkpoint"])))
        except (ValueError, KeyError, TypeError) as err:
            raise IntegrityError(
                f"checkpoint {directory}: {digest.name} is not a rayship digest ({err}); refusing to load it"
            ) from err
    if len(claims) != 1:
        raise IntegrityError(
            f"checkpoint {directory}: its digests name {sorted(claims) or 'no run'}, not one checkpoint of "
            "one run; refusing to load it"
        )
    return claims.pop()


def verify_handoff(directory: Path, path: str, *, storage_root: str, job_run: str, results: str) -> str:
    """Verify a checkpoint handed from one trial of job `job_run` to another (Tune's copy at `path`,
    fetched to `directory`): it lies in the job's Tune results (`results/<trial>/<checkpoint>`) and
    every file is signed by one Train run of a trial of this job with that run's key. Returns what
    it was signed as, `<run>/<checkpoint>`."""
    check_within(path, results, depth=2)
    run, name = _signer(directory)
    if not is_trial_run(run, job_run):
        raise IntegrityError(
            f"checkpoint {path}: signed as {run}/{name}, not by a trial of {job_run}; refusing to load it"
        )
    verify(directory, load_key(storage_root, run), run=run, name=name)
    return f"{run}/{name}"
