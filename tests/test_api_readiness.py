"""The API's readiness (/health) says whether a completion goes through, not only whether
Triton says its models are READY: a model that can serve nothing (here, by construction, a
held engine) turns it to 503 with the reason, and it comes back once completions do."""

from __future__ import annotations

import httpx
from api_server import ApiServer
from engine_hold import engine_held, wait_for

from openai_api import Settings


def test_health_turns_unavailable_while_completions_cannot_go_through(server, tiny_checkpoint):
    settings = Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)
    with ApiServer(settings) as api:
        health = f"{api.url}/health"
        assert httpx.get(health, timeout=60).status_code == 200
        with engine_held(server):
            wait_for(
                lambda: httpx.get(health, timeout=60).status_code == 503,
                "/health stayed ok while no completion could go through",
                timeout=180,
            )
            answer = httpx.get(health, timeout=60).json()
            assert answer["status"] == "unavailable"
            assert "one-token completion failed" in answer["reason"]
            assert set(answer["models"].values()) == {"READY"}  # what Triton alone says
        wait_for(
            lambda: httpx.get(health, timeout=60).status_code == 200,
            "/health did not come back once completions went through again",
            timeout=180,
        )
