"""`flowlane manifests kubernetes`: valid against the Kubernetes API's schemas
(kubernetes-validate) and KEDA's (its models' validators, tools/keda-models), one
Deployment and ScaledObject per deployment unit, and a scaler query that runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import psycopg
import pytest
import yaml

from flowlane import cli, defaults, errors
from flowlane.app import manifests
from flowlane.compiler.api import load_project
from flowlane.runtime.serve import plan_workers
from tests.runtime.rt_support import apply_flows

ROOT = Path(__file__).resolve().parents[2]
KEDA_TOOLS = ROOT / "tools" / "keda-models"
KUBERNETES_VERSION = kubernetes_validate.latest_version()


@pytest.fixture(scope="module")
def made() -> list[manifests.Manifest]:
    """The example project's manifests: worker documents, per-flow and per-step queues."""
    return manifests.kubernetes(load_project([ROOT / "flows"]),
                                manifests.KubernetesOptions(shutdown_timeout=45.5))


def of_kind(made: list[manifests.Manifest], kind: str) -> list[dict[str, Any]]:
    return [d for m in made for d in m.documents if d["kind"] == kind]


def keda_problems(documents: list[dict[str, Any]]) -> list[str]:
    """KEDA's own validators (generated from its API types) on each ScaledObject."""
    assert (KEDA_TOOLS / "node_modules").is_dir(), \
        "KEDA's models are missing: run `sh tools/install-keda-models.sh`"
    done = subprocess.run(["node", "validate.mjs"], cwd=KEDA_TOOLS, input=json.dumps(documents),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.splitlines()


def test_deployments_are_valid_for_the_kubernetes_api(made: list[manifests.Manifest]) -> None:
    deployments = of_kind(made, "Deployment")
    for document in deployments:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    broken = json.loads(json.dumps(deployments[0]))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_scaled_objects_are_valid_for_keda(made: list[manifests.Manifest]) -> None:
    scaled = of_kind(made, "ScaledObject")
    assert keda_problems(scaled) == []
    broken = json.loads(json.dumps(scaled[0]))
    del broken["spec"]["triggers"][0]["type"]
    broken["spec"]["minReplicaCount"] = "one"
    [problem] = keda_problems([broken])
    assert "triggers/0 must have required property type" in problem
    assert "minReplicaCount must be integer" in problem


def test_one_deployment_and_scaled_object_per_unit_with_matching_shutdown(
    made: list[manifests.Manifest],
) -> None:
    units = plan_workers(load_project([ROOT / "flows"]))
    assert [m.name for m in made] == [manifests.resource_name(u.name) for u in units]
    for manifest, unit in zip(made, units, strict=True):
        deployment, scaled = manifest.documents
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 56  # ceil(45.5 + the 10 s margin)
        assert defaults.SHUTDOWN_MARGIN == 10
        [container] = pod["containers"]
        args = container["args"]
        assert args[args.index("--shutdown-timeout") + 1] == "45.5"
        assert args[1:3] in (["--name", unit.name], ["--queue", unit.queue])
        port = int(args[args.index("--metrics-port") + 1])
        assert container["ports"] == [{"name": "metrics", "containerPort": port}]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert scaled["spec"]["triggers"][0]["metadata"]["query"] == (
            f"select flowlane.queue_depth('{unit.queue}')")


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security's "restricted" profile refuses in a pod spec (the controls that a
    worker's pod could break: privilege, capabilities, seccomp, non-root, volume types)."""
    found = []
    pod_context = pod.get("securityContext", {})
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}
    for volume in pod.get("volumes", []):
        if not set(volume) - {"name"} <= allowed_volumes:
            found.append(f"volume {volume['name']}: a type restricted pods may not use")
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{container['name']}: seccompProfile must be RuntimeDefault or Localhost")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: allowPrivilegeEscalation must be false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"{container['name']}: runAsNonRoot must be true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{container['name']}: runAsUser must not be 0")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{container['name']}: capabilities must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{container['name']}: only NET_BIND_SERVICE may be added")
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
    return found


def test_pods_meet_the_restricted_profile_request_resources_and_are_scraped(
    made: list[manifests.Manifest],
) -> None:
    for deployment in of_kind(made, "Deployment"):
        template = deployment["spec"]["template"]
        pod = template["spec"]
        assert restricted_violations(pod) == []
        [container] = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
        assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
        assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                          "limits": {"memory": "512Mi"}}
        port = container["ports"][0]["containerPort"]
        assert template["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true", "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics"}
        assert pod["terminationGracePeriodSeconds"] > 45.5  # longer than the shutdown timeout
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    # the check is live: what a plain pod spec would break
    plain = {"containers": [{"name": "worker", "securityContext": {}}],
             "volumes": [{"name": "data", "hostPath": {"path": "/srv"}}]}
    assert len(restricted_violations(plain)) == 5


def test_resources_come_from_the_options_and_bad_quantities_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["manifests", "kubernetes", str(ROOT / "flows"), "--cpu-request", "250m",
                     "--cpu-limit", "2", "--memory-request", "1Gi", "--memory-limit", "none"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    resources = {json.dumps(c["resources"], sort_keys=True) for d in printed if d["kind"] == "Deployment"
                 for c in d["spec"]["template"]["spec"]["containers"]}
    assert resources == {json.dumps({"limits": {"cpu": "2"}, "requests": {"cpu": "250m", "memory": "1Gi"}},
                                    sort_keys=True)}
    for document in printed:
        if document["kind"] == "Deployment":
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    with pytest.raises(errors.UsageError, match="memory limit is not a Kubernetes quantity: '12XB'"):
        manifests.KubernetesOptions(memory_limit="12XB")


def test_the_command_writes_one_file_per_unit_byte_stable(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = ["manifests", "kubernetes", str(ROOT / "flows"), "--image", "registry.example/app:1"]
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert cli.main([*args, "--out", str(tmp_path / "b")]) == 0
    written = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "b").iterdir()) and written
    for name in written:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    capsys.readouterr()
    assert cli.main(args) == 0  # no --out: every document on stdout
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(printed) == 2 * len(written)
    assert {c["image"] for d in printed if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]} == {"registry.example/app:1"}


def test_long_and_colliding_names() -> None:
    long = manifests.resource_name("Very.Long_" + "x" * 120)
    assert len(long) <= 63 and long.startswith("flowlane-very-long-") and long[-9] == "-"
    assert long != manifests.resource_name("Very.Long_" + "x" * 121)
    with pytest.raises(errors.UsageError, match="replicas"):
        manifests.KubernetesOptions(min_replicas=3, max_replicas=2)
    with pytest.raises(errors.UsageError, match="metrics port"):
        manifests.KubernetesOptions(metrics_port=0)


@pytest.mark.slow
def test_the_scalers_query_runs_on_a_real_database(dsn: str) -> None:
    project = ROOT / "tests" / "runtime" / "project"
    apply_flows(dsn, project)
    made = manifests.kubernetes(load_project([project / "flows"]))
    queries = {d["metadata"]["annotations"]["flowlane.queue"]:
               d["spec"]["triggers"][0]["metadata"]["query"] for d in of_kind(made, "ScaledObject")}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.start_flow('rt_diamond', '{\"numbers\": [1, 2]}')")
        depths = {queue: conn.execute(query.encode()).fetchone() for queue, query in queries.items()}
    assert depths.pop("rt_diamond") == (1,)  # the first step's task, waiting
    assert set(depths.values()) == {(0,)}
