"""Export a GPT-J checkpoint for Triton's FasterTransformer backend (the original GPU path).

FasterTransformer's GPT-J reads one raw little-endian float32 file per tensor from a folder
named ``<tp>-gpu`` that also holds ``config.ini``. Tensors that tensor parallelism splits have
one file per rank (``.<rank>.bin``); the others are whole. Weights are stored as ``x @ W``
kernels, i.e. transposed from PyTorch's ``nn.Linear`` (except the embedding and the LM head):

=========================================================  =====================  ===========
file (per layer ``model.layers.N.`` prefix)                 content                split axis
=========================================================  =====================  ===========
``model.wte.bin``                                          wte [V, E]             -
``model.final_layernorm.{weight,bias}.bin``                ln_f                   -
``model.lm_head.weight.bin`` / ``.bias.bin``               lm_head [V, E] / [V]   -
``input_layernorm.{weight,bias}.bin``                      ln_1                   -
``attention.query_key_value.weight.<r>.bin``               [E, 3, E] (q, k, v)    last
``attention.dense.weight.<r>.bin``                         out_proj.T [E, E]      first
``mlp.dense_h_to_4h.weight.<r>.bin`` / ``.bias.<r>.bin``   fc_in.T [E, I] / [I]   last
``mlp.dense_4h_to_h.weight.<r>.bin``                       fc_out.T [I, E]        first
``mlp.dense_4h_to_h.bias.bin``                             fc_out bias [E]        -
=========================================================  =====================  ===========

The layout was learnt from FasterTransformer's GPT-J weight loader and Hugging Face converter and
from fastertransformer_backend's GPT-J guide; this code is our own. :func:`read_ft_checkpoint`
is the exact inverse of :func:`write_ft_checkpoint` and is what the tests use to prove it.
"""

from __future__ import annotations

import configparser
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from contract.pbtxt import regenerate
from contract.tensors import ENSEMBLE_MODEL, RESULT_OUTPUT_NAMES
from engine.gptj import load_state_dict
from modelbuild import importer

SUPPORTED_TP = (1, 2, 4)
DATA_TYPES = ("fp32", "fp16", "bf16")
MODEL_STAGE = "gptj"
# where build/ft_model_repository is mounted inside the FasterTransformer server image
DEFAULT_CONTAINER_REPOSITORY = "/models"

# the models of the unary pipeline that are copied unchanged; the model stage is replaced
COPIED_STAGES = ("ensemble", "preprocessing", "postprocessing")


def model_stage_contract(model_repository: Path) -> tuple[list, list, int]:
    """(inputs, outputs, max_batch_size) of the python-engine model stage's config.pbtxt, which
    the FasterTransformer stage must expose unchanged: read from it, never written twice."""
    from serving import model_config

    config = model_config.read(Path(model_repository) / MODEL_STAGE)
    name = model_config.DataType.Name
    inputs = [(t.name, name(t.data_type), tuple(t.dims), t.optional) for t in config.input]
    outputs = [
        (t.name, name(t.data_type), tuple(t.dims))
        for t in config.output
        if t.name not in RESULT_OUTPUT_NAMES  # the engine's account, which FT cannot give
    ]
    return inputs, outputs, config.max_batch_size


# files the pre/post-processing stages read from the model stage's checkpoint folder
TOKENIZER_FILES = (*importer.TOKENIZER_FILES, "config.json", "MODEL_CARD.md")


class ExportError(RuntimeError):
    """The checkpoint cannot be exported as asked; the message says why."""


# ----------------------------------------------------------------------------------------------
# dimensions


def dimensions(config: Mapping) -> dict[str, int]:
    """FasterTransformer's names for the GPT-J hyper-parameters of a HF ``config.json``."""
    n_embd, n_head = int(config["n_embd"]), int(config["n_head"])
    return {
        "head_num": n_head,
        "size_per_head": n_embd // n_head,
        "inter_size": int(config.get("n_inner") or 4 * n_embd),
        "num_layer": int(config["n_layer"]),
        "rotary_embedding": int(config.get("rotary_dim") or n_embd // n_head),
        "vocab_size": int(config["vocab_size"]),
    }


def check_split(config: Mapping, tp: int) -> None:
    if tp not in SUPPORTED_TP:
        raise ExportError(f"tensor parallel size {tp} is not one of {SUPPORTED_TP}")
    dims = dimensions(config)
    if dims["head_num"] % tp or dims["inter_size"] % tp:
        raise ExportError(
            f"{dims['head_num']} heads and inner size {dims['inter_size']} "
            f"cannot be split over {tp} GPUs"
        )


def token_ids(checkpoint: Path, config: Mapping) -> tuple[int, int]:
    """start_id and end_id: the config's bos/eos, else the tokenizer's end-of-text token."""
    start, end = config.get("bos_token_id"), config.get("eos_token_id")
    if start is None or end is None:
        tok_file = checkpoint / "tokenizer.json"
        found = None
        if tok_file.is_file():
            for added in json.loads(tok_file.read_text()).get("added_tokens", []):
                if added.get("content") == "<|endoftext|>":
                    found = int(added["id"])
        if found is None:
            raise ExportError(
                f"{checkpoint}: config.json has no bos/eos_token_id and the tokenizer has no "
                "<|endoftext|> token; set them in config.json"
            )
        start = found if start is None else start
        end = found if end is None else end
    return int(start), int(end)


# ----------------------------------------------------------------------------------------------
# the tensors


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy()


def ft_tensors(state: Mapping[str, torch.Tensor], config: Mapping, tp: int) -> dict:
    """File name (without .bin) -> float32 array, for tensor parallel size ``tp``."""
    check_split(config, tp)
    files: dict[str, np.ndarray] = {
        "model.wte": _np(state["transformer.wte.weight"]),
        "model.final_layernorm.weight": _np(state["transformer.ln_f.weight"]),
        "model.final_layernorm.bias": _np(state["transformer.ln_f.bias"]),
        "model.lm_head.weight": _np(state["lm_head.weight"]),
        "model.lm_head.bias": _np(state["lm_head.bias"]),
    }

    def split(name: str, array: np.ndarray, axis: int) -> None:
        for rank, part in enumerate(np.split(array, tp, axis=axis)):
            files[f"{name}.{rank}"] = np.ascontiguousarray(part)

    for layer in range(int(config["n_layer"])):
        hf = f"transformer.h.{layer}."
        ft = f"model.layers.{layer}."
        files[ft + "input_layernorm.weight"] = _np(state[hf + "ln_1.weight"])
        files[ft + "input_layernorm.bias"] = _np(state[hf + "ln_1.bias"])
        # [3, E_out, E_in] -> [E_in, 3, E_out]: every rank keeps q, k and v of its own heads
        qkv = np.stack([_np(state[hf + f"attn.{p}_proj.weight"]) for p in "qkv"])
        split(ft + "attention.query_key_value.weight", qkv.transpose(2, 0, 1), axis=-1)
        split(ft + "attention.dense.weight", _np(state[hf + "attn.out_proj.weight"]).T, axis=0)
        split(ft + "mlp.dense_h_to_4h.weight", _np(state[hf + "mlp.fc_in.weight"]).T, axis=-1)
        split(ft + "mlp.dense_h_to_4h.bias", _np(state[hf + "mlp.fc_in.bias"]), axis=-1)
        split(ft + "mlp.dense_4h_to_h.weight", _np(state[hf + "mlp.fc_out.weight"]).T, axis=0)
        files[ft + "mlp.dense_4h_to_h.bias"] = _np(state[hf + "mlp.fc_out.bias"])
    return files


def config_ini(config: Mapping, start_id: int, end_id: int, tp: int, name: str) -> str:
    parser = configparser.ConfigParser()
    parser["gptj"] = {
        "model_name": name,
        **{k: str(v) for k, v in dimensions(config).items()},
        "start_id": str(start_id),
        "end_id": str(end_id),
        "weight_data_type": "fp32",
        "tensor_para_size": str(tp),
    }
    lines: list[str] = []

    class _Sink:
        def write(self, text: str) -> None:
            lines.append(text)

    parser.write(_Sink(), space_around_delimiters=False)
    return "".join(lines)


def write_ft_checkpoint(checkpoint: Path, out_dir: Path, tp: int) -> Path:
    """Write ``<out_dir>/<tp>-gpu/`` (per-tensor .bin files + config.ini); returns that folder."""
    checkpoint = Path(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("model_type", "gptj") != "gptj":
        raise ExportError(f"{checkpoint} is not a GPT-J checkpoint; import it first")
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise ExportError(f"no *.safetensors weights in {checkpoint}; run `make model` first")
    state = load_state_dict(checkpoint)
    if "lm_head.bias" not in state:
        state["lm_head.bias"] = torch.zeros(state["lm_head.weight"].shape[0])
    start_id, end_id = token_ids(checkpoint, config)
    tensors = ft_tensors(state, config, tp)

    folder = Path(out_dir) / f"{tp}-gpu"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, array in tensors.items():
        array.astype("<f4").tofile(folder / f"{name}.bin")
    name = str(config.get("_name_or_path") or "codegen-gptj")
    (folder / "config.ini").write_text(config_ini(config, start_id, end_id, tp, name))
    return folder


def read_ft_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Rebuild the GPT-J state dict from a ``<tp>-gpu`` folder, using only config.ini for shapes."""
    parser = configparser.ConfigParser()
    parser.read(Path(folder) / "config.ini")
    ini = dict(parser["gptj"])
    tp = int(ini["tensor_para_size"])
    embed = int(ini["head_num"]) * int(ini["size_per_head"])
    inner, vocab = int(ini["inter_size"]), int(ini["vocab_size"])

    def load(name: str, shape: tuple[int, ...]) -> np.ndarray:
        path = Path(folder) / f"{name}.bin"
        array = np.fromfile(path, dtype="<f4")
        if array.size != int(np.prod(shape)):
            raise ExportError(f"{path.name}: {array.size} values, expected shape {shape}")
        return array.reshape(shape)

    def joined(name: str, shape: tuple[int, ...], axis: int) -> np.ndarray:
        return np.concatenate([load(f"{name}.{r}", shape) for r in range(tp)], axis=axis)

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array))

    state = {
        "transformer.wte.weight": tensor(load("model.wte", (vocab, embed))),
        "transformer.ln_f.weight": tensor(load("model.final_layernorm.weight", (embed,))),
        "transformer.ln_f.bias": tensor(load("model.final_layernorm.bias", (embed,))),
        "lm_head.weight": tensor(load("model.lm_head.weight", (vocab, embed))),
        "lm_head.bias": tensor(load("model.lm_head.bias", (vocab,))),
    }
    for layer in range(int(ini["num_layer"])):
        hf, ft = f"transformer.h.{layer}.", f"model.layers.{layer}."
        state[hf + "ln_1.weight"] = tensor(load(ft + "input_layernorm.weight", (embed,)))
        state[hf + "ln_1.bias"] = tensor(load(ft + "input_layernorm.bias", (embed,)))
        qkv = joined(ft + "attention.query_key_value.weight", (embed, 3, embed // tp), -1)
        for i, p in enumerate("qkv"):
            state[hf + f"attn.{p}_proj.weight"] = tensor(qkv[:, i, :].T)
        dense = joined(ft + "attention.dense.weight", (embed // tp, embed), 0)
        state[hf + "attn.out_proj.weight"] = tensor(dense.T)
        fc_in = joined(ft + "mlp.dense_h_to_4h.weight", (embed, inner // tp), -1)
        state[hf + "mlp.fc_in.weight"] = tensor(fc_in.T)
        state[hf + "mlp.fc_in.bias"] = tensor(
            joined(ft + "mlp.dense_h_to_4h.bias", (inner // tp,), -1)
        )
        fc_out = joined(ft + "mlp.dense_4h_to_h.weight", (inner // tp, embed), 0)
        state[hf + "mlp.fc_out.weight"] = tensor(fc_out.T)
        state[hf + "mlp.fc_out.bias"] = tensor(load(ft + "mlp.dense_4h_to_h.bias", (embed,)))
    return state, ini


# ----------------------------------------------------------------------------------------------
# the Triton model repository


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def model_config_pbtxt(
    *,
    name: str,
    inputs: list,
    outputs: list,
    max_batch_size: int,
    data_type: str,
    tp: int,
    checkpoint_path: str,
    default_model_filename: str,
) -> str:
    """config.pbtxt of the model stage on the FasterTransformer backend, same tensor contract."""
    if data_type not in DATA_TYPES:
        raise ExportError(f"data type {data_type!r} is not one of {DATA_TYPES}")
    lines = [
        "# Stage 2 on NVIDIA's FasterTransformer backend (GPU only), written by",
        "# `make model ENGINE=fastertransformer` (modelbuild/fastertransformer.py).",
        "# Same tensors as model_repository/gptj/config.pbtxt: the ensemble is unchanged.",
        f'name: "{name}"',
        'backend: "fastertransformer"',
        f'default_model_filename: "{default_model_filename}"',
        f"max_batch_size: {max_batch_size}",
        "model_transaction_policy { decoupled: false }",
        "input [",
    ]
    entries = []
    for tensor, dtype, dims, optional in inputs:
        entry = f'  {{ name: "{tensor}" data_type: {dtype} dims: {_dims(dims)}'
        if dims == (1,):  # FasterTransformer takes per-request scalars as [batch]
            entry += " reshape: { shape: [ ] }"
        if optional:
            entry += " optional: true"
        entries.append(entry + " }")
    lines.append(",\n".join(entries))
    lines += ["]", "output ["]
    lines.append(
        ",\n".join(
            f'  {{ name: "{tensor}" data_type: {dtype} dims: {_dims(dims)} }}'
            for tensor, dtype, dims in outputs
        )
    )
    lines += [
        "]",
        "# FasterTransformer manages its GPUs itself: one CPU-kind instance drives all ranks.",
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
        "dynamic_batching { max_queue_delay_microseconds: 2000 }",
    ]
    params = {
        "model_type": "GPT-J",
        "data_type": data_type,
        "tensor_para_size": str(tp),
        "pipeline_para_size": "1",
        "model_checkpoint_path": checkpoint_path,
        "enable_custom_all_reduce": "0",
    }
    lines += [
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        for key, value in params.items()
    ]
    return "\n".join(lines) + "\n"


def write_ft_model_repository(
    checkpoint: Path,
    model_repository: Path,
    out_repository: Path,
    tp: int,
    data_type: str = "fp16",
    container_repository: str = DEFAULT_CONTAINER_REPOSITORY,
) -> Path:
    """A Triton model repository whose model stage runs on the FasterTransformer backend.

    ``ensemble``, ``preprocessing`` and ``postprocessing`` are copied from ``model_repository``;
    ``gptj/`` gets the FasterTransformer config.pbtxt, the weights in ``1/<tp>-gpu/`` and the
    tokenizer in ``1/checkpoint/`` (where the pre/post-processing stages look for it). The
    checkpoint path in config.pbtxt is the one the folder has once ``out_repository`` is mounted
    at ``container_repository`` (``/models`` in docker/Dockerfile.fastertransformer).
    """
    checkpoint, model_repository = Path(checkpoint), Path(model_repository)
    out_repository = Path(out_repository)
    if data_type not in DATA_TYPES:
        raise ExportError(f"data type {data_type!r} is not one of {DATA_TYPES}")
    config = json.loads((checkpoint / "config.json").read_text())
    check_split(config, tp)
    if out_repository.exists():
        shutil.rmtree(out_repository)
    out_repository.mkdir(parents=True)
    inputs, outputs, max_batch_size = model_stage_contract(model_repository)
    for stage in COPIED_STAGES:
        shutil.copytree(
            model_repository / stage,
            out_repository / stage,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    # FasterTransformer gives no account of a generation (finish reason, token counts): the
    # copied ensemble neither maps nor declares those outputs
    ensemble = out_repository / ENSEMBLE_MODEL / "config.pbtxt"
    ensemble.write_text(regenerate(ensemble.read_text(), ENSEMBLE_MODEL, RESULT_OUTPUT_NAMES))
    version = out_repository / MODEL_STAGE / "1"
    weights = write_ft_checkpoint(checkpoint, version, tp)
    tokenizer_dir = version / "checkpoint"
    tokenizer_dir.mkdir()
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, tokenizer_dir / name)
    in_container = f"{container_repository.rstrip('/')}/{MODEL_STAGE}/1/{weights.name}"
    (out_repository / MODEL_STAGE / "config.pbtxt").write_text(
        model_config_pbtxt(
            name=MODEL_STAGE,
            inputs=inputs,
            outputs=outputs,
            max_batch_size=max_batch_size,
            data_type=data_type,
            tp=tp,
            checkpoint_path=in_container,
            default_model_filename=weights.name,
        )
    )
    return out_repository
