"""The generated CRDs on the real API server: `kubectl apply` rejects what rayship rejects (the same
bad corpus, server-side dry run, with the field in the message) and accepts every sample."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from rayship import api
from tests.conftest import SAMPLES, rayship_samples
from tests.unit.bad_corpus import MESSAGE_CASES, METADATA_CASES, RAYSHIP_ONLY_CASES, SPEC_CASES

pytestmark = pytest.mark.operator


def dry_run_create(kube, doc: dict) -> ApiException | None:
    group, version, plural = api.KIND_BY_NAME[doc["kind"]].resource
    body = copy.deepcopy(doc)
    body["metadata"]["namespace"] = kube.namespace
    try:
        kube.custom.create_namespaced_custom_object(
            group, version, kube.namespace, plural, body, dry_run="All", field_validation="Strict"
        )
    except ApiException as err:
        return err
    return None


@pytest.mark.parametrize("sample", rayship_samples(), ids=lambda p: p.stem)
def test_the_server_accepts_every_sample(kube, sample) -> None:
    assert dry_run_create(kube, yaml.safe_load(sample.read_text())) is None


def _dry_run_each(kube, cases):
    """(case, field, the API server's refusal or None) of each corpus case, applied to the DDP sample."""
    base = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    for case, mutate, field in cases:
        doc = copy.deepcopy(base)
        mutate(doc)
        yield case, field, dry_run_create(kube, doc)


def test_the_server_rejects_the_bad_corpus_naming_the_field(kube) -> None:
    accepted = []
    for case, field, refused in _dry_run_each(kube, SPEC_CASES):
        if refused is None:
            accepted.append(case)
            continue
        assert refused.status in (400, 422), (case, refused.status, refused.body)  # strict decoding: 400
        # The server names the field (its path differs in style) or says our rule's message.
        last = field.replace("spec.", "").split(".")[-1].split("[")[0]
        assert last in refused.body or field in refused.body, (case, field, refused.body[:400])
    assert not accepted, f"the API server accepts what rayship rejects: {accepted}"


def test_the_server_refuses_the_metadata_rayship_refuses(kube) -> None:
    """bad_corpus.METADATA_CASES: rayship refuses them before sending (tests/unit/test_cli.py) because
    the API server would, by its own metadata checks: proven here, on the real one."""
    accepted = []
    for case, _said, refused in _dry_run_each(kube, METADATA_CASES):
        if refused is None:
            accepted.append(case)
        else:
            assert refused.status == 422 and "metadata." in refused.body, (case, refused.body[:300])
    assert not accepted, f"the API server takes what rayship refuses: {accepted}"


def test_what_only_rayship_can_reject_is_documented_as_such(kube) -> None:
    """No CRD rule can say these (see bad_corpus.RAYSHIP_ONLY_CASES): the server accepts them and
    the operator marks the object Invalid (tests/unit: test_cli, the models)."""
    base = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    for case, mutate, _field in RAYSHIP_ONLY_CASES:
        doc = copy.deepcopy(base)
        mutate(doc)
        if case == "int-beyond-int64":
            continue  # the kubernetes client cannot even send it as an integer
        assert dry_run_create(kube, doc) is None, case


# What the API server says for a lower bound above its upper one: the rule's messageExpression, with the
# values (rayship says the same with each field's whole path: bad_corpus.MESSAGE_CASES).
SAID_WITH_VALUES = {
    "replicas-min-above-max": "replicas.min (5) is more than replicas.max (3)",
    "replicas-initial-outside": "replicas.initial (4) is not within replicas.min..replicas.max (1..3)",
    "workers-min-replicas-above-replicas": "workers.minReplicas (3) is more than workers.replicas (2)",
    "autoscaling-min-above-max": "autoscaling.minReplicas (4) is more than autoscaling.maxReplicas (2)",
    "asha-grace-above-max-t": "tuning.asha.gracePeriod (5) is more than tuning.asha.maxT (3)",
    "search-low-above-high": "low (0.5) is not below high (0.05)",
}


def test_the_server_says_the_values_of_a_lower_bound_above_its_upper_one(kube) -> None:
    said = {}
    for case, sample, mutate, _line in MESSAGE_CASES:
        if case not in SAID_WITH_VALUES:
            continue
        doc = yaml.safe_load((SAMPLES / sample).read_text())
        mutate(doc)
        refused = dry_run_create(kube, doc)
        said[case] = refused.body if refused is not None else "accepted"
    assert said.keys() == SAID_WITH_VALUES.keys()
    assert {c: SAID_WITH_VALUES[c] in body for c, body in said.items()} == dict.fromkeys(said, True), said
