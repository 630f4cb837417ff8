"""The request of the load test this project was built from, exactly as it sends it, on both
backends: unary over HTTP and gRPC (``ensemble``), streamed over gRPC and HTTP
(``ensemble_stream``), each answered with its log probs."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
PROMPT = "def helloworld():"
OUTPUT_LEN = 128
# every option, once each, with the values and wire types that load test sends
OPTIONS = {
    "runtime_top_k": np.uint32(3),
    "runtime_top_p": np.float32(0.92),
    "temperature": np.float32(0.5),
    "len_penalty": np.float32(-1),
    "repetition_penalty": np.float32(1.1),
    "random_seed": np.uint64(42),
    "is_return_log_probs": np.bool_(True),
    "beam_width": np.uint32(1),
    "beam_search_diversity_rate": np.float32(0.5),
    "start_id": np.uint32(220),
    "end_id": np.uint32(50256),
}


@pytest.fixture(params=["server", "openvino_server"])
def any_server(request):
    """The torch backend's server and the openvino (default) backend's."""
    return request.getfixturevalue(request.param)


def seed_arrays() -> dict[str, np.ndarray]:
    arrays = {
        "INPUT_0": np.array([[PROMPT]], dtype=object),
        "INPUT_1": np.array([[OUTPUT_LEN]], dtype=np.uint32),
        "INPUT_2": np.array([[""]], dtype=object),
        "INPUT_3": np.array([[""]], dtype=object),
    }
    return arrays | {name: np.array([[value]]) for name, value in OPTIONS.items()}


def inputs(module) -> list:
    items = []
    for name, array in seed_arrays().items():
        item = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def check_log_probs(log_probs: list[float], cumulative: float, generated: int) -> None:
    """One log prob per generated token, each a probability's, summing to the cumulative."""
    assert len(log_probs) == generated > 0
    assert all(np.isfinite(lp) and lp <= 0.0 for lp in log_probs)
    assert sum(log_probs) < 0.0
    assert cumulative == pytest.approx(sum(log_probs), abs=1e-3)


def unary(server, protocol: str) -> tuple[str, list[float], float]:
    module = PROTOCOLS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    result = module.InferenceServerClient(url).infer("ensemble", inputs(module))
    text = result.as_numpy("OUTPUT_0").reshape(-1)[0].decode()
    log_probs = [float(x) for x in result.as_numpy("output_log_probs").reshape(-1)]
    return text, log_probs, float(result.as_numpy("cum_log_probs").reshape(-1)[0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_seed_request_is_answered_with_log_probs(any_server, protocol):
    text, log_probs, cumulative = unary(any_server, protocol)
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    check_log_probs(log_probs, cumulative, len(log_probs))
    assert unary(any_server, protocol)[0] == text  # seed 42 twice: the same text


def test_the_seed_request_streams_over_grpc_with_log_probs(any_server):
    whole, unary_log_probs, _ = unary(any_server, "grpc")
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(any_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "ensemble_stream", inputs(grpcclient), enable_empty_final_response=True
        )
        pieces, log_probs, cumulative = [], [], 0.0
        while True:
            result, error = answers.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                pieces.append(result.as_numpy("OUTPUT_0").reshape(-1)[0].decode())
                log_probs += [float(x) for x in result.as_numpy("output_log_probs").reshape(-1)]
                cumulative = float(result.as_numpy("cum_log_probs").reshape(-1)[0])
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert PROMPT + "".join(pieces) == whole  # the same sampled text as the unary answer
    check_log_probs(log_probs, cumulative, len(unary_log_probs))
    assert log_probs == pytest.approx(unary_log_probs, abs=1e-4)


def test_the_seed_request_streams_over_http_with_log_probs(any_server):
    whole, unary_log_probs, _ = unary(any_server, "http")
    body = {name: array.reshape(-1)[0] for name, array in seed_arrays().items()}
    body = {k: v.item() if isinstance(v, np.generic) else v for k, v in body.items()}
    url = f"http://{any_server.http_url}/v2/models/ensemble_stream/generate_stream"
    with requests.post(url, json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        events = [
            json.loads(line.removeprefix(b"data:"))
            for line in response.iter_lines()
            if line.startswith(b"data:")
        ]
    assert events and not any("error" in event for event in events), events
    pieces = [str(np.ravel(event.get("OUTPUT_0", ""))[0]) for event in events]
    log_probs = [float(x) for event in events for x in np.ravel(event.get("output_log_probs", []))]
    cumulative = float(np.ravel(events[-1]["cum_log_probs"])[0])
    assert PROMPT + "".join(pieces) == whole
    check_log_probs(log_probs, cumulative, len(unary_log_probs))
