"""The container files as `make docker-check` runs them, checked statically: no Docker engine here.

`make docker-check` (scripts/docker-check.sh) builds and runs the images on a machine with an
engine; it is a developer's check, never CI's. These tests keep what it relies on from drifting:
each image's base is a build argument defaulting to a public image, each runs as a non-root user,
the compose file runs with docker-compose 1.x as well as the plugin, and its Prometheus names
Triton by the address the host reaches it at.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from serving.paths import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
SCRIPTS = sorted((REPO_ROOT / "scripts").glob("docker-*.sh"))
PUBLIC_REGISTRIES = ("nvcr.io/", "prom/", "python:", "debian:")


def _instructions(dockerfile) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_base_is_a_build_argument_defaulting_to_a_public_image(dockerfile):
    instructions = _instructions(dockerfile)
    first_from = next(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    defaults = dict(
        arg.split("=", 1)
        for name, args in instructions[:first_from]
        if name == "ARG"
        for arg in args.split()
        if "=" in arg
    )
    assert defaults.get("BASE_IMAGE", "").startswith(PUBLIC_REGISTRIES), defaults
    for name, args in instructions:
        if name == "FROM":
            assert args.split()[0] == "${BASE_IMAGE}", f"{dockerfile.name}: FROM {args}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_image_runs_as_a_non_root_user(dockerfile):
    users = [args for name, args in _instructions(dockerfile) if name == "USER"]
    assert users, f"{dockerfile.name} has no USER"
    assert users[-1].split(":")[0] not in {"root", "0"}, users[-1]


def test_the_cpu_image_keeps_its_install_in_one_layer_after_the_metadata():
    """On the vfs storage driver every instruction copies the whole file system: the few
    instructions after the install layer must not multiply a multi-GB image."""
    names = [name for name, _ in _instructions(DOCKER / "Dockerfile.cpu")]
    assert names.count("RUN") == 1
    assert names[names.index("RUN") + 1 :] == ["USER"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_compose_runs_with_docker_compose_1(compose):
    """docker-compose 1.29 (Debian 12's) rejects a top-level name: docker/.env names the project."""
    assert "name" not in compose
    env = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env["COMPOSE_PROJECT_NAME"] == "codegen-triton"
    for name, service in compose["services"].items():
        test = service.get("healthcheck", {}).get("test")
        if isinstance(test, list):
            assert test[0] in {"NONE", "CMD", "CMD-SHELL"}, name


def test_prometheus_image_is_the_public_one_unless_told(compose):
    prometheus = compose["services"]["prometheus"]
    assert prometheus["image"] == "${PROMETHEUS_IMAGE:-prom/prometheus:v2.54.1}"
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]
    assert (DOCKER / "Dockerfile.prometheus").is_file()


def test_prometheus_names_triton_as_the_host_reaches_it(compose):
    """`make loadtest HOST=127.0.0.1:8000 PROMETHEUS_URL=...` finds its server in the composed
    Prometheus by the instance label: the published metrics port on a local host."""
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (relabel,) = job["relabel_configs"]
    assert relabel["target_label"] == "instance"
    host, _, port = relabel["replacement"].rpartition(":")
    assert host == "localhost"
    assert f"{port}:8002" in compose["services"]["triton"]["ports"]


def test_the_server_and_api_get_time_for_a_graceful_stop(compose):
    """Triton's exit timeout (10 s) and the launcher's margin fit before docker's SIGKILL."""
    for name in ("triton", "api"):
        assert compose["services"][name]["stop_grace_period"] == "30s", name
    assert "--stop-timeout 30" in (REPO_ROOT / "scripts" / "docker-run.sh").read_text()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_docker_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ci_and_make_test_need_no_docker():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "docker" not in ci
    makefile = (REPO_ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M)
    assert test_rule is not None and "docker" not in test_rule.group(1)
