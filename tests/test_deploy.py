"""Deployment files, checked offline: no Docker engine, GPU or cluster is needed.

* k8s: every overlay is rendered with ``kubectl kustomize`` and each object validated against the
  Kubernetes OpenAPI schemas (kubernetes-validate); the rest is checked structurally.
* docker: every Dockerfile is linted with hadolint; the compose file's structure is checked.
* metrics: every metric the dashboard, alerts and the HPA rule query is one Triton exports.
* security: checkov scans the rendered manifests and the Dockerfiles (when installed, see
  scripts/setup-scan-venv.sh) and must report no failed check; skips carry a justification.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import deploy_metrics
import kubernetes_validate
import pytest
import yaml

from serving import watchdog
from serving.paths import REPO_ROOT

K8S = REPO_ROOT / "k8s"
DOCKER = REPO_ROOT / "docker"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
KUBERNETES_VERSION = "1.33.0"
# CustomResourceDefinitions have no schema in the Kubernetes OpenAPI documents that
# kubernetes-validate ships, so only these kinds skip schema validation; their structure is
# checked by hand below (test_service_monitor_scrapes_the_metrics_port).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def _tool(name: str) -> str | None:
    for candidate in (
        Path(sys.executable).parent / name,
        REPO_ROOT / ".venv" / "bin" / name,
        REPO_ROOT / ".venv-scan" / "bin" / name,
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        cmd = [kubectl, "kustomize", str(path)]
    elif shutil.which("kustomize"):
        cmd = [shutil.which("kustomize"), "build", str(path)]
    else:
        pytest.fail("neither kubectl nor kustomize is installed: install kubectl to render k8s/")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: kustomize(K8S / "overlays" / name) for name in OVERLAYS}


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------------------------------------
# Kubernetes


def test_both_overlays_exist():
    assert {"cpu", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_validate_against_kubernetes_schemas(rendered, overlay):
    objects = rendered[overlay]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ServiceMonitor", "HorizontalPodAutoscaler"} <= kinds
    for obj in objects:
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name")
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_broken_object(rendered):
    """Guard against a validator that accepts anything."""
    broken = json.loads(json.dumps(one(rendered["cpu"], "Deployment")))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_prometheus_adapter_config_renders_and_validates():
    objects = kustomize(K8S / "prometheus-adapter")
    config_map = one(objects, "ConfigMap")
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)
    assert config_map["metadata"]["namespace"] == "monitoring"
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    assert rules == deploy_metrics.adapter_rules()
    # the Helm values carry the same rule
    values = yaml.safe_load(deploy_metrics.ADAPTER_VALUES.read_text())
    assert values["rules"]["custom"] == rules


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_probes_ports_shm_resources_security(rendered, overlay):
    deployment = one(rendered[overlay], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == TRITON_PORTS
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    # Kubernetes and the launcher's watchdog call a server hung at the same point
    live = container["livenessProbe"]
    assert live["periodSeconds"] == watchdog.LIVENESS_PERIOD_S
    assert live["timeoutSeconds"] == watchdog.LIVENESS_TIMEOUT_S
    assert live["failureThreshold"] == watchdog.LIVENESS_FAILURES
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    if security.get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts  # the python backend and HOME need a writable /tmp
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()


def test_cpu_and_gpu_overlays_differ_where_they_should(rendered):
    cpu = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]
    gpu = one(rendered["gpu"], "Deployment")["spec"]["template"]["spec"]
    assert cpu["containers"][0]["image"].endswith(":cpu")
    assert gpu["containers"][0]["image"].endswith(":gpu")
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])
    mounts = {m["mountPath"] for m in gpu["containers"][0]["volumeMounts"]}
    assert "/opt/app/model_repository/gptj/1/checkpoint" in mounts
    claim = one(rendered["gpu"], "PersistentVolumeClaim")["metadata"]["name"]
    volumes = [v for v in gpu["volumes"] if "persistentVolumeClaim" in v]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == claim


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_exposes_the_three_ports(rendered, overlay):
    objects = rendered[overlay]
    service = one(objects, "Service")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {name: (port, name) for name, port in TRITON_PORTS.items()}
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_the_metrics_port(rendered, overlay):
    objects = rendered[overlay]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(objects, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings"}
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_on_the_adapter_queue_time_metric(rendered, overlay):
    objects = rendered[overlay]
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        one(objects, "Deployment")["metadata"]["name"],
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    served = {rule["name"]["as"]: rule for rule in deploy_metrics.adapter_rules()}
    rule = served[metric["pods"]["metric"]["name"]]
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]


# ---------------------------------------------------------------------------------------------
# Docker


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = _tool("hadolint")
    assert hadolint is not None, "hadolint is not installed: run `make setup-dev`"
    result = subprocess.run(
        [hadolint, "--config", str(REPO_ROOT / ".hadolint.yaml"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_all_four_images_exist():
    names = {p.name for p in DOCKERFILES}
    assert {"Dockerfile.cpu", "Dockerfile.gpu", "Dockerfile.fastertransformer"} <= names
    assert "Dockerfile.client" in names
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    assert "nvcr.io/nvidia/tritonserver" in gpu and "torch==2.13.0" in gpu
    ft = (DOCKER / "Dockerfile.fastertransformer").read_text()
    assert "fastertransformer_backend" in ft
    assert "/opt/tritonserver/backends/fastertransformer" in ft


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_compose_structure(compose):
    services = compose["services"]
    assert {"triton", "prometheus", "grafana"} <= services.keys()
    named_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        assert service.get("image"), f"{name} has no image"
        if "build" in service:
            context = (DOCKER / service["build"]["context"]).resolve()
            assert (context / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                path = (DOCKER / source).resolve()
                generated = path.is_relative_to(REPO_ROOT / "build") or "checkpoint" in source
                assert generated or path.exists(), f"{name}: {source} does not exist"
            else:
                assert source in named_volumes, f"{name}: undeclared volume {source}"
    # the server profiles publish the same ports; within one profile no host port repeats
    profiles: dict[str, list[str]] = {}
    for name, service in services.items():
        for profile in service.get("profiles", ["default"]):
            profiles.setdefault(profile, []).append(name)
    for profile, names in profiles.items():
        members = set(names) | ({*profiles["default"]} if profile != "default" else set())
        members -= {"triton"} if profile != "default" else set()
        host_ports = [str(p).split(":")[0] for n in members for p in services[n].get("ports", [])]
        assert len(host_ports) == len(set(host_ports)), (profile, host_ports)
    for name in ("triton", "triton-gpu", "triton-ft"):
        if name in services:
            ports = [str(p) for p in services[name]["ports"]]
            assert ports == ["8000:8000", "8001:8001", "8002:8002"], name
            assert services[name].get("shm_size"), name


def test_prometheus_scrapes_the_server_and_loads_the_alerts(compose):
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    targets = [
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    ]
    assert "triton:8002" in targets
    mounts = dict(v.split(":")[1::-1][:2] for v in compose["services"]["prometheus"]["volumes"])
    for rule_file in config["rule_files"]:
        assert rule_file in mounts, f"{rule_file} is not mounted into prometheus"
        assert (DOCKER / mounts[rule_file]).resolve().is_file()
    # every server variant answers to "triton" on the compose network
    for name, service in compose["services"].items():
        if name.startswith("triton") and name != "triton":
            assert "triton" in service["networks"]["default"]["aliases"]


def test_grafana_requires_a_password_and_allows_no_anonymous_access(compose):
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")


def test_cpu_image_listens_everywhere_and_never_writes_under_app(compose):
    dockerfile = (DOCKER / "Dockerfile.cpu").read_text()
    assert "serving.triton --prepare-only" in dockerfile  # runtime copy made at build time
    assert '"--address", "0.0.0.0"' in dockerfile  # make triton itself defaults to 127.0.0.1


def test_grafana_is_provisioned_with_the_dashboard(compose):
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if ":" in v}
    provisioning = (DOCKER / mounts["/etc/grafana/provisioning"]).resolve()
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "dashboards.yml").read_text())
    folder = providers["providers"][0]["options"]["path"]
    dashboards = (DOCKER / mounts[folder]).resolve()
    dashboard = json.loads((dashboards / "triton.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 6
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("requests per second", "latency", "batch size", "queue", "stage"):
        assert topic in titles


# ---------------------------------------------------------------------------------------------
# metrics


def test_every_queried_metric_is_one_triton_exports():
    by_source = deploy_metrics.referenced_by_source()
    for source, names in by_source.items():
        assert names, f"no metric found in the {source}"
        unknown = names - deploy_metrics.TRITON_METRICS
        assert not unknown, f"{source} queries metrics Triton does not export: {unknown}"
    referenced = deploy_metrics.referenced_metric_names()
    assert {"nv_inference_queue_duration_us", "nv_inference_exec_count"} <= referenced


def test_metric_extraction_sees_through_promql():
    expr = (
        'sum by (model) (rate(foo_us{model="gptj"}[5m])) / ignoring(model) group_left '
        "clamp_min(sum(rate(bar_total[1m])), 1e-9) > 0.5 and absent(up) "
        "or quantile_over_time(0.9, (baz)[15m:15s])"
    )
    assert deploy_metrics.metric_names(expr) == {"foo_us", "bar_total", "up", "baz"}
    adapter = 'sum by (<<.GroupBy>>) (rate(qux{<<.LabelMatchers>>,model="gptj"}[1m]))'
    assert deploy_metrics.metric_names(adapter) == {"qux"}


# ---------------------------------------------------------------------------------------------
# static security scan


def _checkov(target_args: list[str]) -> dict:
    checkov = _tool("checkov")
    assert checkov is not None, "checkov is not installed: run `make setup-dev`"
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "ERROR"}
    env.pop("BC_API_KEY", None)
    result = subprocess.run(
        [checkov, *target_args, "--output", "json", "--quiet", "--skip-download", "--compact"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    return report if isinstance(report, dict) else {"results": {}, "summary": {}}


def _assert_clean(report: dict) -> None:
    results = report.get("results", {})
    failed = [
        f"{c['check_id']} {c['check_name']} ({c.get('file_path')}:{c.get('resource')})"
        for c in results.get("failed_checks", [])
    ]
    assert not failed, "checkov findings:\n" + "\n".join(failed)
    for skipped in results.get("skipped_checks", []):
        reason = (skipped.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason.strip()) > 20, f"{skipped['check_id']} skipped without a justification"


def test_checkov_finds_nothing_in_the_kubernetes_manifests(rendered, tmp_path):
    for name, objects in rendered.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))
    adapter = kustomize(K8S / "prometheus-adapter")
    (tmp_path / "prometheus-adapter.yaml").write_text(yaml.safe_dump_all(adapter))
    report = _checkov(["-d", str(tmp_path), "--framework", "kubernetes"])
    assert report["summary"].get("passed", 0) > 50
    _assert_clean(report)


def test_checkov_finds_nothing_in_the_dockerfiles():
    report = _checkov(["-d", str(DOCKER), "--framework", "dockerfile"])
    assert report["summary"].get("passed", 0) > 20
    _assert_clean(report)
