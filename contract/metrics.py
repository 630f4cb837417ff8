"""Names of every metric the project reads or exports: Triton's own and the engine's.

The engine model answers requests asynchronously (its ``execute`` returns at once and the engine
responds later), and so do ``gptj`` and ``ensemble_stream``, which pass requests on to it, so
Triton's ``nv_inference_compute_infer_duration_us`` for those models counts only admission. The
engine therefore exports its own counters through the python backend's custom metrics; they
appear on Triton's metrics port next to the ``nv_*`` families. This is the one place that
explains it; the load test, the dashboards and the tests take the names from here.
"""

# Triton's per-model counters (labels: model, version); all cumulative since start.
INFERENCE_COUNT = "nv_inference_count"
EXEC_COUNT = "nv_inference_exec_count"
REQUEST_SUCCESS = "nv_inference_request_success"
REQUEST_FAILURE = "nv_inference_request_failure"
REQUEST_DURATION_US = "nv_inference_request_duration_us"
QUEUE_DURATION_US = "nv_inference_queue_duration_us"
COMPUTE_INPUT_DURATION_US = "nv_inference_compute_input_duration_us"
COMPUTE_INFER_DURATION_US = "nv_inference_compute_infer_duration_us"
COMPUTE_OUTPUT_DURATION_US = "nv_inference_compute_output_duration_us"
PENDING_REQUEST_COUNT = "nv_inference_pending_request_count"

# The engine's counters (label: model), exported by the engine model (the server's one engine).
ENGINE_REQUESTS = "codegen_engine_requests_total"
ENGINE_CANCELLED = "codegen_engine_cancelled_total"
ENGINE_REQUEST_DURATION_US = "codegen_engine_request_duration_us_total"
ENGINE_QUEUE_DURATION_US = "codegen_engine_queue_duration_us_total"
ENGINE_COMPUTE_DURATION_US = "codegen_engine_compute_duration_us_total"
ENGINE_STEPS = "codegen_engine_steps_total"
ENGINE_STEP_ROWS = "codegen_engine_step_rows_total"
ENGINE_PROMPT_TOKENS = "codegen_engine_prompt_tokens_total"
ENGINE_PROMPT_TOKENS_REUSED = "codegen_engine_prompt_tokens_reused_total"
ENGINE_GENERATED_TOKENS = "codegen_engine_generated_tokens_total"
ENGINE_RUNNING = "codegen_engine_running_sequences"
ENGINE_LAST_STEP = "codegen_engine_last_step_timestamp_seconds"
ENGINE_KV_CACHE_BYTES = "codegen_engine_kv_cache_bytes"
# Answers an editor stop rule ended (single_line, n_indent, t_max_predict_ms), and the tokens
# generated past such a stop (the engine decides on each token, so this stays 0).
ENGINE_EDITOR_STOPS = "codegen_engine_editor_stops_total"
ENGINE_TOKENS_PAST_STOP = "codegen_engine_tokens_past_stop_total"
# Labels: model and reason (engine/fallback.py, REASONS: bad_words, beam_diversity,
# beam_stop_words, log_probs, token_healing, other). Requests the openvino backend cannot honour
# exactly, run on the torch engine instead of refused (docs/openvino.md); 0 on a server without
# a fallback.
ENGINE_FALLBACK_REQUESTS = "codegen_engine_fallback_requests_total"
ENGINE_FALLBACK_HELP = "Sequences the primary backend could not honour, run on the fallback engine"

# Exported by the models that call the engine (label: model = gptj or ensemble_stream).
CANCELS_SENT = "codegen_cancels_sent_total"
CALLS_IN_FLIGHT = "codegen_calls_in_flight"
CALLER_METRIC_HELP = {
    CANCELS_SENT: "Engine requests whose client went away, cancelled through the cancel channel",
}
CALLER_GAUGE_HELP = {
    CALLS_IN_FLIGHT: "Requests this model has in flight to the engine (each holds a slot)",
}

ENGINE_METRIC_HELP = {
    ENGINE_REQUESTS: "Sequences finished by the generation engine",
    ENGINE_CANCELLED: "Sequences dropped because their client went away (or cancelled)",
    ENGINE_REQUEST_DURATION_US: "Microseconds from engine submission to the last token",
    ENGINE_QUEUE_DURATION_US: "Microseconds sequences waited in the engine before prefill",
    ENGINE_COMPUTE_DURATION_US: "Microseconds the engine spent computing (prefill and decode)",
    ENGINE_STEPS: "Forward passes run by the engine (prefill and decode)",
    ENGINE_STEP_ROWS: "Sequences processed summed over forward passes (mean batch = rows/steps)",
    ENGINE_PROMPT_TOKENS: "Prompt tokens prefilled",
    # the openvino backend's prefix cache: whole KV blocks of the prompt that earlier requests
    # computed (counted by the backend's own index of them; the pipeline reports no reuse)
    ENGINE_PROMPT_TOKENS_REUSED: "Prompt tokens whose KV blocks the prefix cache held",
    ENGINE_GENERATED_TOKENS: "Tokens generated",
    ENGINE_EDITOR_STOPS: "Sequences ended by an editor stop rule (single line, indent, time)",
    ENGINE_TOKENS_PAST_STOP: "Tokens generated after the token a stop rule ended a sequence at",
}
ENGINE_GAUGE_HELP = {
    ENGINE_RUNNING: "Sequences currently running in the engine",
    # time() - this, while sequences are running, is how long the engine has been stuck
    ENGINE_LAST_STEP: "Unix time at which the engine finished its last forward pass",
    ENGINE_KV_CACHE_BYTES: "Bytes the engine's KV cache holds (0 while idle: it is released)",
}
