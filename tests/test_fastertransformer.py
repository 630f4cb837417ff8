"""FasterTransformer export: per-tensor files for tp 1/2/4, config.ini, model repository."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.tensors import RESULT_OUTPUT_NAMES
from modelbuild import fastertransformer as ft
from serving import model_config
from serving.paths import MODEL_REPOSITORY

N_LAYER, N_EMBD, N_HEAD, N_INNER, VOCAB, ROTARY = 2, 32, 4, 48, 97, 4
BOS, EOS = 95, 96


def gptj_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random GPT-J weights with the GPTJForCausalLM names (every value distinct)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    state = {
        "transformer.wte.weight": rand(VOCAB, N_EMBD),
        "transformer.ln_f.weight": rand(N_EMBD),
        "transformer.ln_f.bias": rand(N_EMBD),
        "lm_head.weight": rand(VOCAB, N_EMBD),
        "lm_head.bias": rand(VOCAB),
    }
    for layer in range(N_LAYER):
        p = f"transformer.h.{layer}."
        state |= {
            p + "ln_1.weight": rand(N_EMBD),
            p + "ln_1.bias": rand(N_EMBD),
            p + "attn.q_proj.weight": rand(N_EMBD, N_EMBD),
            p + "attn.k_proj.weight": rand(N_EMBD, N_EMBD),
            p + "attn.v_proj.weight": rand(N_EMBD, N_EMBD),
            p + "attn.out_proj.weight": rand(N_EMBD, N_EMBD),
            p + "mlp.fc_in.weight": rand(N_INNER, N_EMBD),
            p + "mlp.fc_in.bias": rand(N_INNER),
            p + "mlp.fc_out.weight": rand(N_EMBD, N_INNER),
            p + "mlp.fc_out.bias": rand(N_EMBD),
        }
    return state


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoint")
    save_file(gptj_state(), str(folder / "model.safetensors"))
    config = {
        "model_type": "gptj",
        "architectures": ["GPTJForCausalLM"],
        "vocab_size": VOCAB,
        "n_positions": 64,
        "n_embd": N_EMBD,
        "n_layer": N_LAYER,
        "n_head": N_HEAD,
        "n_inner": N_INNER,
        "rotary_dim": ROTARY,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text('{"added_tokens": []}')
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "MODEL_CARD.md").write_text("# tiny\n")
    return folder


def expected_files(tp: int) -> set[str]:
    names = {
        "config.ini",
        "model.wte.bin",
        "model.final_layernorm.weight.bin",
        "model.final_layernorm.bias.bin",
        "model.lm_head.weight.bin",
        "model.lm_head.bias.bin",
    }
    for layer in range(N_LAYER):
        p = f"model.layers.{layer}."
        names |= {p + n for n in ("input_layernorm.weight.bin", "input_layernorm.bias.bin")}
        names.add(p + "mlp.dense_4h_to_h.bias.bin")
        for rank in range(tp):
            names |= {
                p + f"attention.query_key_value.weight.{rank}.bin",
                p + f"attention.dense.weight.{rank}.bin",
                p + f"mlp.dense_h_to_4h.weight.{rank}.bin",
                p + f"mlp.dense_h_to_4h.bias.{rank}.bin",
                p + f"mlp.dense_4h_to_h.weight.{rank}.bin",
            }
    return names


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_files_rebuild_the_weights_exactly(checkpoint, tmp_path, tp):
    folder = ft.write_ft_checkpoint(checkpoint, tmp_path, tp)
    assert folder.name == f"{tp}-gpu"
    assert {p.name for p in folder.iterdir()} == expected_files(tp)
    rebuilt, _ = ft.read_ft_checkpoint(folder)
    original = load_file(checkpoint / "model.safetensors")
    assert rebuilt.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(rebuilt[name], tensor), name


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_holds_its_own_heads_in_ft_orientation(checkpoint, tmp_path, tp):
    """Spot-check the on-disk layout itself, independently of read_ft_checkpoint."""
    folder = ft.write_ft_checkpoint(checkpoint, tmp_path, tp)
    state = load_file(checkpoint / "model.safetensors")
    local = N_EMBD // tp
    for rank in range(tp):
        raw = np.fromfile(
            folder / f"model.layers.1.attention.query_key_value.weight.{rank}.bin", dtype="<f4"
        ).reshape(N_EMBD, 3, local)
        heads = slice(rank * local, (rank + 1) * local)
        for i, proj in enumerate("qkv"):
            weight = state[f"transformer.h.1.attn.{proj}_proj.weight"]
            np.testing.assert_array_equal(raw[:, i, :], weight[heads].T.numpy())
        dense = np.fromfile(
            folder / f"model.layers.1.attention.dense.weight.{rank}.bin", dtype="<f4"
        ).reshape(local, N_EMBD)
        np.testing.assert_array_equal(
            dense, state["transformer.h.1.attn.out_proj.weight"].T[heads].numpy()
        )
    size = (folder / "model.wte.bin").stat().st_size
    assert size == VOCAB * N_EMBD * 4  # raw float32, no header
    wte = np.fromfile(folder / "model.wte.bin", dtype="<f4").reshape(VOCAB, N_EMBD)
    np.testing.assert_array_equal(wte, state["transformer.wte.weight"].numpy())


def test_config_ini_holds_dimensions_and_token_ids(checkpoint, tmp_path):
    folder = ft.write_ft_checkpoint(checkpoint, tmp_path, 2)
    parser = configparser.ConfigParser()
    parser.read(folder / "config.ini")
    ini = parser["gptj"]
    assert int(ini["head_num"]) == N_HEAD
    assert int(ini["size_per_head"]) == N_EMBD // N_HEAD
    assert int(ini["inter_size"]) == N_INNER
    assert int(ini["num_layer"]) == N_LAYER
    assert int(ini["rotary_embedding"]) == ROTARY
    assert int(ini["vocab_size"]) == VOCAB
    assert (int(ini["start_id"]), int(ini["end_id"])) == (BOS, EOS)
    assert ini["weight_data_type"] == "fp32"
    assert int(ini["tensor_para_size"]) == 2


def test_token_ids_fall_back_to_the_tokenizer(checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = json.loads((checkpoint / "config.json").read_text())
    del config["bos_token_id"], config["eos_token_id"]
    tokenizer = {"added_tokens": [{"id": 7, "content": "<|endoftext|>"}]}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert ft.token_ids(folder, config) == (7, 7)
    (folder / "tokenizer.json").write_text('{"added_tokens": []}')
    with pytest.raises(ft.ExportError, match="bos/eos"):
        ft.token_ids(folder, config)


def test_unsupported_splits_are_refused(checkpoint, tmp_path):
    with pytest.raises(ft.ExportError, match="not one of"):
        ft.write_ft_checkpoint(checkpoint, tmp_path, 3)
    config = json.loads((checkpoint / "config.json").read_text()) | {"n_head": 2, "n_embd": 32}
    with pytest.raises(ft.ExportError, match="cannot be split"):
        ft.check_split(config, 4)


# ---------------------------------------------------------------------------------------------
# the Triton model repository


def contract(config) -> tuple[set, set]:
    inputs = {(i.name, i.data_type, tuple(i.dims), i.optional) for i in config.input}
    outputs = {(o.name, o.data_type, tuple(o.dims)) for o in config.output}
    return inputs, outputs


@pytest.fixture(scope="module")
def ft_repository(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "ft_model_repository"
    return ft.write_ft_model_repository(checkpoint, MODEL_REPOSITORY, out, tp=2, data_type="fp16")


def test_model_stage_config_is_a_valid_fastertransformer_config(ft_repository):
    config = model_config.read(ft_repository / "gptj")
    assert config.name == "gptj"
    assert config.backend == "fastertransformer"
    assert config.max_batch_size > 0
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["model_type"] == "GPT-J"
    assert params["data_type"] == "fp16"
    assert params["tensor_para_size"] == "2"
    assert params["pipeline_para_size"] == "1"
    assert params["model_checkpoint_path"] == "/models/gptj/1/2-gpu"
    assert config.default_model_filename == "2-gpu"
    assert (ft_repository / "gptj" / "1" / "2-gpu" / "config.ini").is_file()
    # per-request scalars reach FasterTransformer as [batch]
    reshaped = {i.name for i in config.input if i.HasField("reshape")}
    assert {"input_lengths", "runtime_top_k", "random_seed", "end_id"} <= reshaped
    assert "input_ids" not in reshaped and "stop_words_list" not in reshaped


def test_model_stage_keeps_the_tensor_contract(ft_repository):
    config = model_config.read(ft_repository / "gptj")
    inputs, outputs = contract(config)
    assert {"input_ids", "request_output_len", "bad_words_list"} <= {i[0] for i in inputs}
    assert {o[0] for o in outputs} == {
        "output_ids",
        "sequence_length",
        "cum_log_probs",
        "output_log_probs",
    }
    input_ids = next(i[1] for i in inputs if i[0] == "input_ids")
    assert input_ids == model_config.DataType.Value("TYPE_UINT32")
    served = MODEL_REPOSITORY / "gptj" / "config.pbtxt"
    if served.is_file():  # the python-engine stage exposes the same tensors, and its account
        served_inputs, served_outputs = contract(model_config.read(served))
        assert served_inputs == inputs
        assert {o for o in served_outputs if o[0] not in RESULT_OUTPUT_NAMES} == outputs
        assert config.max_batch_size == model_config.read(served).max_batch_size


def test_the_unary_pipelines_other_stages_are_copied_unchanged(ft_repository):
    source = MODEL_REPOSITORY
    served = {p.name for p in ft_repository.iterdir() if (p / "config.pbtxt").is_file()}
    # ensemble_stream runs the python engine itself: it has no place in a FasterTransformer repo
    assert served == {"ensemble", "preprocessing", "gptj", "postprocessing"}
    ensemble_config = ft_repository / "ensemble" / "config.pbtxt"
    for stage in ft.COPIED_STAGES:
        for file in (source / stage).rglob("*"):
            if file.is_file() and "__pycache__" not in file.parts:
                copy = ft_repository / stage / file.relative_to(source / stage)
                if copy != ensemble_config:
                    assert copy.read_bytes() == file.read_bytes(), copy


def test_the_ensemble_maps_only_what_the_fastertransformer_stage_gives(ft_repository):
    """The platform ensemble stays preprocessing -> gptj -> postprocessing; FT gives no account
    (finish reason, token counts), so the copied ensemble neither maps nor declares it."""
    ensemble = model_config.read(ft_repository / "ensemble")
    served = model_config.read(MODEL_REPOSITORY / "ensemble")
    assert ensemble.platform == "ensemble"
    steps = [step.model_name for step in ensemble.ensemble_scheduling.step]
    assert steps == ["preprocessing", "gptj", "postprocessing"]
    ft_outputs = {t.name for t in model_config.read(ft_repository / "gptj").output}
    mapped = set(ensemble.ensemble_scheduling.step[1].output_map)
    assert mapped <= ft_outputs
    assert {t.name for t in ensemble.output} == {
        t.name for t in served.output if t.name not in RESULT_OUTPUT_NAMES
    }
    assert set(RESULT_OUTPUT_NAMES) <= {t.name for t in served.output}
    assert list(ensemble.input) == list(served.input)
    # the tokenizer stays where preprocessing/postprocessing look for it
    assert (ft_repository / "gptj" / "1" / "checkpoint" / "tokenizer.json").is_file()
    assert not list((ft_repository / "gptj" / "1" / "checkpoint").glob("*.safetensors"))


def test_bad_data_type_is_refused(checkpoint, tmp_path):
    with pytest.raises(ft.ExportError, match="data type"):
        ft.write_ft_model_repository(
            checkpoint, MODEL_REPOSITORY, tmp_path / "r", tp=1, data_type="int4"
        )
