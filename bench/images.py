"""The product images: their sizes against what goes into them, and a rebuild after a source change.

    python3 bench/images.py [--no-rebuild]

Question (issue 36 §3): are the images no bigger than their contents (no duplicated layers, no build
tools or caches left in), and does a change to our Python sources rebuild only the last layer?
Goals: image_operator_mb <= 250; image_workloads_cpu_mb <= 1.15x its pinned wheels (installed) plus
its base; images_rebuild_after_source_change_s <= 60.

Sizes are read from what `python3 images/build.py` records of each build (built first if missing):
each layer's size as Docker keeps it (uncompressed), with the instruction that made it, so a table
shows where the bytes are. The baseline of the workload image is what must be in it: its operating
system (the layers before the first pip install from the wheelhouse: Debian minbase and the packages
the Dockerfiles add) plus every wheel of the wheelhouse installed (the sum of each wheel's
uncompressed files; deepspeed's sdist by its unpacked size).

The rebuild: a git worktree of HEAD with one comment line added to workloads/rayship_workloads/
__init__.py is built with the same cache (Docker's layer cache and the registry included), then the
repo itself again (the registry keeps the newest build of each image); each prints its build, checks
and push. Baseline: the same command with nothing changed (the hash check alone). The pull into a
running cluster's containerd is not part of this figure (`make cluster-up` prints it).

Prints tables and ends with one RESULT line per figure; never fails on the goals. Takes ~1 min
(the images built; a first build of them ~12 min).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from images import build as images  # noqa: E402

MB = 1e6


def os_layers(found: list[tuple[int, str]]) -> int:
    """How many of the first layers are the operating system's: those before the first pip install
    from the wheelhouse (PIP_FIND_LINKS in its instruction)."""
    return next((i for i, (_, made) in enumerate(found) if "PIP_FIND_LINKS=" in made), len(found))


def installed_size(path: Path) -> int:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return sum(info.file_size for info in wheel.infolist())
    if path.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path) as sdist:
            return sum(member.size for member in sdist.getmembers() if member.isfile())
    return path.stat().st_size


def sizes() -> dict[str, float]:
    images.ensure_built(log=lambda line: print(line, flush=True))
    figures: dict[str, float] = {}
    for image in images.images():
        # the steps that added bytes (docker history also lists those that only set metadata)
        found = [(size, made) for size, made in image.record()["layers"] if size > 0]
        system = os_layers(found)
        total = sum(size for size, _ in found)
        base = sum(size for size, _ in found[:system])
        print(
            f"\n{image.ref}: {total / MB:.0f} MB in {len(found)} layers (* the operating system's: {base / MB:.0f} MB)"
        )
        print(f"  {'MB':>8}  layer (the instruction that made it)")
        for index, (size, made) in enumerate(found):
            mark = "* " if index < system else "  "
            print(f"  {size / MB:8.1f}  {mark}{' '.join(made.split())[:150]}")
        figures[f"{image.name}_mb"] = total / MB
        figures[f"{image.name}_base_mb"] = base / MB
    wheels = sorted(images.wheelhouse().glob("*"))
    installed = sum(installed_size(p) for p in wheels if p.is_file())
    figures["wheels_installed_mb"] = installed / MB
    return figures


def timed_build(repo: Path) -> tuple[float, str]:
    """Wall seconds of `python3 <repo>/images/build.py` and its timing line for the workload image."""
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(repo / "images" / "build.py")], capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"images/build.py in {repo} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    line = next(
        (x for x in out.stdout.splitlines() if "rayship-workloads" in x and " built in " in x),
        "nothing built",
    )
    return wall, line.removeprefix("images: ")


def rebuild() -> list[tuple[str, float, str]]:
    rows = [("nothing changed (baseline)", *timed_build(ROOT))]
    with tempfile.TemporaryDirectory(prefix="rayship-bench-images-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), "HEAD"],
            check=True,
            capture_output=True,
        )
        try:
            init = tree / "workloads" / "rayship_workloads" / "__init__.py"
            init.write_text(init.read_text() + "# a source change (bench/images.py)\n")
            rows.append(("a source change", *timed_build(tree)))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    rows.append(("the change undone (the repo's sources)", *timed_build(ROOT)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-rebuild", action="store_true", help="sizes only")
    args = parser.parse_args()
    figures = sizes()
    base, wheels = figures["rayship-workloads_base_mb"], figures["wheels_installed_mb"]
    print(
        f"\nworkload image {figures['rayship-workloads_mb']:.0f} MB against its operating system {base:.0f} MB + the "
        f"wheelhouse installed {wheels:.0f} MB = {base + wheels:.0f} MB (baseline)"
    )
    results = {
        "image_operator_mb": figures["rayship-operator_mb"],
        "image_workloads_cpu_mb": figures["rayship-workloads_mb"],
        "image_workloads_over_wheels_and_base": figures["rayship-workloads_mb"] / (base + wheels),
    }
    if not args.no_rebuild:
        rows = rebuild()
        print(f"\n{'wall s':>8}  build of the images")
        for what, wall, line in rows:
            print(f"{wall:8.1f}  {what}: {line}")
        results["images_rebuild_after_source_change_s"] = max(wall for what, wall, _ in rows[1:])
    for name, value in results.items():
        print(f"RESULT {name}={value:.2f}" if value < 10 else f"RESULT {name}={value:.0f}")


if __name__ == "__main__":
    main()
