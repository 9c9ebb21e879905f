"""The generated CRDs on the real API server: `kubectl apply` rejects what rayship rejects (the same
bad corpus, server-side dry run, with the field in the message) and accepts every sample."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from rayship import api
from tests.conftest import SAMPLES, rayship_samples
from tests.unit.bad_corpus import RAYSHIP_ONLY_CASES, SPEC_CASES

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


def test_the_server_rejects_the_bad_corpus_naming_the_field(kube) -> None:
    base = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    accepted = []
    for case, mutate, field in SPEC_CASES:
        doc = copy.deepcopy(base)
        mutate(doc)
        refused = dry_run_create(kube, doc)
        if refused is None:
            accepted.append(case)
            continue
        assert refused.status in (400, 422), (case, refused.status, refused.body)  # strict decoding: 400
        # The server names the field (its path differs in style) or says our rule's message.
        last = field.replace("spec.", "").split(".")[-1].split("[")[0]
        assert last in refused.body or field in refused.body, (case, field, refused.body[:400])
    assert not accepted, f"the API server accepts what rayship rejects: {accepted}"


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
