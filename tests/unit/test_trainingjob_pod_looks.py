"""When the operator looks at a TrainingJob's Ray pods (a LIST) for what its attempts hold
(controller/trainingjob/attempts.py): it watches no pods, so a pod's end is as good as the looks
around it."""

from __future__ import annotations

from datetime import timedelta

from rayship.controller import trainingjob
from rayship.controller.trainingjob import derive
from rayship.controller.trainingjob.attempts import POD_LOOK_SECONDS
from tests.unit.test_trainingjob_status import NOW, obs, ray_pod, rayjob, rfc

TJ = {"metadata": {"name": "tj"}, "status": {}}
SELECTOR = "rayship.dev/trainingjob=tj,ray.io/node-type"


def with_ttl(rj: dict, seconds: int) -> dict:
    return {**rj, "spec": {"ttlSecondsAfterFinished": seconds}}


def test_the_pods_are_looked_at_when_an_attempt_starts_now_and_then_and_until_an_ended_ones_are_gone() -> (
    None
):
    """Not at every pass: when an attempt starts, every POD_LOOK_SECONDS while it runs, as it ends, and
    until the ended one's pods are gone."""
    running = rayjob("Running", "RUNNING", startTime=rfc(NOW), rayClusterName="c1")
    assert trainingjob.ray_pods(TJ, running, NOW) == SELECTOR  # a new attempt
    st = derive(obs(running, ray_pods=()), NOW)
    assert trainingjob.ray_pods({**TJ, "status": st}, running, NOW + timedelta(seconds=10)) is None
    due = NOW + timedelta(seconds=POD_LOOK_SECONDS)
    assert trainingjob.ray_pods({**TJ, "status": st}, running, due) == SELECTOR
    done = rayjob("Complete", "SUCCEEDED", startTime=rfc(NOW), endTime=rfc(due), rayClusterName="c1")
    # the pass that ends it looks, however recent the last look: its pods' last sight before they go
    assert trainingjob.ray_pods({**TJ, "status": st}, done, NOW + timedelta(seconds=1)) == SELECTOR
    ended = derive(obs(done, current=st, ray_pods=(ray_pod("h", "c1", NOW, deleting=due),)), due)
    assert trainingjob.ray_pods({**TJ, "status": ended}, done, due) == SELECTOR  # until its pods are gone
    assert trainingjob.look_again_in({**TJ, "status": ended}, done, due) == 0  # being deleted: soon
    settled = derive(obs(done, current=ended, ray_pods=()), due + timedelta(seconds=5))
    assert trainingjob.ray_pods({**TJ, "status": settled}, done, due + timedelta(hours=1)) is None
    assert trainingjob.look_again_in({**TJ, "status": settled}, done, due + timedelta(hours=1)) is None
    assert trainingjob.pods_going({**TJ, "status": ended}, done, due)
    assert not trainingjob.pods_going({**TJ, "status": settled}, done, due + timedelta(hours=1))
    assert settled["cpuSeconds"] == 0.5 * POD_LOOK_SECONDS


def test_a_finished_jobs_pods_are_looked_at_when_kuberay_is_due_to_delete_them() -> None:
    """A finished job's cluster lingers ttlSecondsAfterFinished: the next look is then (never more than
    POD_LOOK_SECONDS away), soon after for a while (KubeRay deletes it on its own schedule), then every
    POD_LOOK_SECONDS again."""
    running = rayjob("Running", "RUNNING", startTime=rfc(NOW), rayClusterName="c1")
    st = derive(obs(running, ray_pods=()), NOW)
    end = NOW + timedelta(seconds=30)
    done = rayjob("Complete", "SUCCEEDED", startTime=rfc(NOW), endTime=rfc(end), rayClusterName="c1")
    lingering = {**TJ, "status": derive(obs(done, current=st, ray_pods=(ray_pod("h", "c1", NOW),)), end)}
    assert trainingjob.look_again_in(lingering, with_ttl(done, 5), end) == 5
    assert not trainingjob.pods_going(lingering, with_ttl(done, 5), end)  # KubeRay deletes them in 5 s
    assert trainingjob.look_again_in(lingering, with_ttl(done, 5), end + timedelta(seconds=2)) == 3
    assert trainingjob.look_again_in(lingering, with_ttl(done, 600), end) == POD_LOOK_SECONDS
    assert trainingjob.look_again_in(lingering, with_ttl(done, 600), end + timedelta(seconds=590)) == 10
    assert trainingjob.look_again_in(lingering, with_ttl(done, 5), end + timedelta(seconds=6)) == 0
    late = end + timedelta(seconds=5 + POD_LOOK_SECONDS + 1)
    assert trainingjob.look_again_in(lingering, with_ttl(done, 5), late) == POD_LOOK_SECONDS


def test_a_failing_attempt_is_looked_at_as_it_fails_and_soon_after_until_the_next_starts() -> None:
    """KubeRay deletes a failed attempt's cluster at once and starts the next: its pods are seen as it
    fails, then soon again, whatever ttlSecondsAfterFinished says."""
    running = rayjob("Running", "RUNNING", startTime=rfc(NOW), rayClusterName="c1")
    st = derive(obs(running, ray_pods=(ray_pod("w", "c1", NOW),)), NOW)
    failing = with_ttl(rayjob("Running", "FAILED", startTime=rfc(NOW), rayClusterName="c1"), 600)
    soon = NOW + timedelta(seconds=5)
    assert trainingjob.ray_pods({**TJ, "status": st}, failing, soon) == SELECTOR
    failed = derive(obs(failing, current=st, ray_pods=(ray_pod("w", "c1", NOW),)), soon)
    assert failed["attempts"][0]["outcome"] == "Failed" and "endTime" not in failed["attempts"][0]
    assert trainingjob.look_again_in({**TJ, "status": failed}, failing, soon) == 0
    retrying = with_ttl(rayjob("Retrying", "FAILED", startTime=rfc(NOW), rayClusterName="c1"), 600)
    # seen as it failed: not at every pass of the Retrying state (the soon looks are the recheck's)
    assert trainingjob.ray_pods({**TJ, "status": failed}, retrying, soon + timedelta(seconds=1)) is None
    # its pods go within seconds of KubeRay's delete while the next attempt's cluster starts: the
    # recheck looks closely then (GOING_LOOK_SECONDS), not at the starting pods' pace
    starting = rayjob("Initializing", startTime=rfc(soon), rayClusterName="c2", failed=1)
    assert trainingjob.starting_pods(starting) is not None
    assert trainingjob.pods_going({**TJ, "status": failed}, starting, soon + timedelta(seconds=2))
    assert not trainingjob.pods_going({**TJ, "status": st}, running, soon)  # nothing ended: not going


def test_a_change_of_the_ready_worker_count_is_looked_at() -> None:
    """A worker pod taken away (or its replacement ready) changes KubeRay's ready count: the pods are
    looked at then, not up to POD_LOOK_SECONDS later (a pod gone between two looks is estimated)."""
    ready = {"readyWorkerReplicas": 3}
    running = rayjob("Running", "RUNNING", startTime=rfc(NOW), rayClusterName="c1", rayClusterStatus=ready)
    st = derive(obs(running, ray_pods=(ray_pod("w", "c1", NOW),)), NOW)
    assert st["readyWorkers"] == 3
    later = NOW + timedelta(seconds=10)
    assert trainingjob.ray_pods({**TJ, "status": st}, running, later) is None
    fewer = rayjob("Running", "RUNNING", startTime=rfc(NOW), rayClusterName="c1",
                   rayClusterStatus={"readyWorkerReplicas": 2})  # fmt: skip
    assert trainingjob.ray_pods({**TJ, "status": st}, fewer, later) == SELECTOR
