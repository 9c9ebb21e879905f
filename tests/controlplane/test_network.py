"""What `down` undoes of the network namespace folder (controlplane/network.py `release_netns_dir`), on a
folder of the test's own with real bind mounts, as `ip netns add` makes of /run/netns (it bind-mounts
the folder onto itself when it is not a mount point, and keeps that mount for good)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controlplane.network import is_mount_point, release_netns_dir


def _bind_onto_itself(path: Path) -> None:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)


@pytest.fixture(autouse=True)
def own_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The note of what an `up` made, the test's own: the host's (/run/rayship-netns-made) belongs to a
    cluster that may be up beside the tests (the clean-clone CI of bb2076a: a test read it, removed a
    folder it had not made and dropped the note)."""
    from controlplane import network

    mark = tmp_path / "made"
    monkeypatch.setattr(network, "NETNS_MADE_MARK", mark)
    return mark


@pytest.fixture
def folder(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")  # under CI=true a failure (tests/conftest.py)
    path = tmp_path / "netns"
    yield path
    while is_mount_point(path):  # whatever a failing test left
        subprocess.run(["umount", str(path)], check=True)


def test_a_folder_that_was_there_loses_the_mount_up_caused_and_stays(folder: Path) -> None:
    """The case a CI run met: /run/netns there, not mounted; `up` recorded no folder it made, and the
    mount `ip netns add` made was left (`mount /run/netns` in `down --check`)."""
    folder.mkdir()
    _bind_onto_itself(folder)
    assert release_netns_dir(folder, made_dir=False, made_mount=True) == []
    assert not is_mount_point(folder) and folder.is_dir()


def test_a_folder_up_made_goes_with_every_mount_of_it(folder: Path) -> None:
    folder.mkdir()
    _bind_onto_itself(folder)
    _bind_onto_itself(folder)  # stacked: one umount would leave one
    assert release_netns_dir(folder, made_dir=True, made_mount=True) == []
    assert not folder.exists()


def test_a_mount_that_was_there_stays(folder: Path) -> None:
    folder.mkdir()
    _bind_onto_itself(folder)
    assert release_netns_dir(folder, made_dir=False, made_mount=False) == []
    assert is_mount_point(folder)


def test_a_folder_with_someone_elses_namespace_is_left_as_it_is(folder: Path) -> None:
    folder.mkdir()
    _bind_onto_itself(folder)
    (folder / "theirs").touch()
    assert release_netns_dir(folder, made_dir=True, made_mount=True) == []
    assert is_mount_point(folder) and (folder / "theirs").exists()


def test_two_clusters_at_once_the_last_down_undoes_what_the_first_up_made(
    folder: Path, own_mark: Path
) -> None:
    """`make test` runs the local cluster and the kind cluster at once: the first `up` makes the mount,
    the second finds it (nothing of its own to undo), the first `down` finds the second's namespace in
    the folder; the second `down`, leaving it empty, undoes the first's mount (the clean-clone CI of
    9b217d7 left `mount /run/netns` so), and the note of it goes."""
    from controlplane.network import note_netns_dir

    mark = own_mark
    folder.mkdir()
    first = note_netns_dir(folder)
    _bind_onto_itself(folder)  # what the first `ip netns add` does
    second = note_netns_dir(folder)
    assert first == (False, True) and second == (False, False) and mark.exists()
    (folder / "kind").touch()  # the second cluster's namespace
    assert release_netns_dir(folder, made_dir=first[0], made_mount=first[1]) == []
    assert is_mount_point(folder) and mark.exists()  # not while another namespace is in it
    (folder / "kind").unlink()
    assert release_netns_dir(folder, made_dir=second[0], made_mount=second[1]) == []
    assert not is_mount_point(folder) and folder.is_dir() and not mark.exists()
