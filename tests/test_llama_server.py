"""reporting/llama_server.py: the peer's launcher finds its binary and GGUF or says which
command makes them; it never builds llama.cpp itself."""

from __future__ import annotations

import json

import pytest

from reporting.llama_server import LlamaServer, checkpoint_gguf, llama_server_binary


def test_a_missing_binary_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make llama-server"):
        llama_server_binary(tmp_path / "llama-server")


def test_a_trained_checkpoint_has_no_gguf_to_serve(tmp_path):
    with pytest.raises(FileNotFoundError, match="not made from a GGUF"):
        checkpoint_gguf(tmp_path)


def test_the_gguf_is_found_where_make_model_unpacks_it(tmp_path):
    checkpoint, downloads = tmp_path / "ckpt", tmp_path / "downloads"
    checkpoint.mkdir()
    made = {"name": "llm-x", "version": "1.0", "gguf": "X.Q4_1.gguf"}  # as make model writes it
    (checkpoint / "pretrained.json").write_text(json.dumps(made))
    with pytest.raises(FileNotFoundError, match="make model FORCE=1"):
        checkpoint_gguf(checkpoint, downloads)
    gguf = downloads / "llm-x-1.0" / "X.Q4_1.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")
    assert checkpoint_gguf(checkpoint, downloads) == gguf


def test_the_server_is_local_with_metrics_and_one_slot_per_client(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    server = LlamaServer(tmp_path / "m.gguf", 9999, tmp_path / "log", parallel=16, binary=binary)
    command = server.command()
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--parallel"] == "16"
    assert "--metrics" in command and server.ready_url == "http://127.0.0.1:9999/health"
