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
