"""The sweep's command line, its endpoints and the protocol targets (no server needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from loadtest.sweep.settings import DEFAULTS, QUICK, parse_args
from loadtest.targets import TARGETS
from reporting.triton import Endpoints
from serving.paths import REPO_ROOT


def test_defaults_and_the_quick_preset():
    full = parse_args([])
    assert full.lengths == DEFAULTS["lengths"] == (8, 32, 128, 512)
    assert (full.users, full.duration, full.warmup) == (16, 100.0, 12.0)
    quick = parse_args(["--quick"])
    assert (quick.lengths, quick.users, quick.duration) == ((8, 32), 4, 6.0)
    assert quick.stream_duration == QUICK["stream_duration"]
    # a flag given explicitly wins over the preset
    mixed = parse_args(["--quick", "--users", "2", "--lengths", "4,8,16"])
    assert (mixed.users, mixed.lengths, mixed.warmup) == (2, (4, 8, 16), QUICK["warmup"])
    assert mixed.out.parent == REPO_ROOT / "loadtest" / "results"
    assert mixed.out.name.endswith("-http")


@pytest.mark.parametrize("argv", [["--lengths", "8,x"], ["--lengths", "0"], ["--host", "nope"]])
def test_bad_flags_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_endpoints_follow_make_triton_port_layout():
    e = Endpoints.from_host("http://localhost:9000/")
    assert (e.host, e.grpc, e.metrics_url) == (
        "localhost:9000",
        "localhost:9001",
        "http://localhost:9002/metrics",
    )
    assert e.http_url == "http://localhost:9000"
    assert e.is_local and (e.ports.http, e.ports.grpc, e.ports.metrics) == (9000, 9001, 9002)
    assert e.metrics_target == "127.0.0.1:9002"
    remote = parse_args(["--host", "triton:8000", "--metrics-url", "http://m:7000/metrics"])
    assert not remote.endpoints.is_local
    assert remote.endpoints.grpc == "triton:8001"
    assert remote.endpoints.metrics_target == "m:7000"


def test_every_protocol_names_a_user_class_that_exists():
    """Checked on the source: importing locust here would gevent-patch the test process."""
    assert set(TARGETS) >= {"http", "grpc", "openai"}
    for protocol, target in TARGETS.items():
        module, _, name = target.user_class.partition(":")
        source = (REPO_ROOT / Path(*module.split("."))).with_suffix(".py").read_text()
        tree = ast.parse(source)
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        assert target.protocol == protocol
        assert name in classes, target
        assert parse_args(["--protocol", protocol]).target is target
