"""report.md: the original load test's format, from a typed :class:`RunResult`.

The prose lives in ``loadtest/templates/report.md`` (``string.Template`` pieces); this module
only formats the figures that fill it and picks the optional pieces.
"""

from __future__ import annotations

from pathlib import Path

from contract import metrics as names
from contract.tensors import (
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    MODEL_STAGE,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
)
from loadtest.metrics import MODELS, reuse_line, sample_name
from loadtest.results import (
    RPS_LATENCY_CHART,
    STAGE_SHARES_CHART,
    LengthResult,
    RunResult,
    timeseries_chart,
)
from loadtest.targets import header_fields
from reporting.tables import number, percent, table, templates

TEMPLATES = Path(__file__).parents[1] / "templates" / "report.md"
PRE, POST = PREPROCESSING_MODEL, POSTPROCESSING_MODEL


def _fill(template: str, /, **values: object) -> str:
    return templates(TEMPLATES)[template].substitute(values)


def render(result: RunResult) -> str:
    run, s = result.run, result.run.settings
    stream_setup = (
        _fill("stream_setup", users=s.stream_users, seconds=f"{s.stream_duration_s:.0f}")
        if s.stream_users
        else _fill("no_stream_setup")
    )
    return (
        _fill(
            "report",
            **header_fields(run),
            users=s.users,
            protocol=s.protocol.upper(),
            warmup=f"{s.warmup_s:.0f}",
            duration=f"{s.duration_s:.0f}",
            prompts=s.prompts,
            prompt_seed=s.prompt_seed,
            sampling=s.sampling,
            stream_setup=stream_setup,
            prometheus=run.prometheus,
            lengths=" vs ".join(str(n) for n in s.lengths),
            summary_table="\n".join(_summary_table(result.rows)),
            rps_latency_chart=RPS_LATENCY_CHART,
            stage_shares_chart=STAGE_SHARES_CHART,
            length_sections="\n".join([_length_section(row) for row in result.rows]),
        )
        + "\n"
    )


SUMMARY_HEADER = (
    "output len", "requests", "RPS", "mean ms", "p50", "p90", "p95", "p99", "failures",
    "tokens/s", "tokens/req", "batch pre / gptj / post", "engine batch", "pre % of model",
    "post % of model", "queue share",
)  # fmt: skip


def _summary_table(rows: list[LengthResult]) -> list[str]:
    cells = []
    for r in rows:
        lat, b, s = r.latency_ms, r.batch_size, r.stage_share
        batches = f"{number(b[PRE], 2)} / {number(b[MODEL_STAGE], 2)} / {number(b[POST], 2)}"
        cells.append(
            (r.output_len, r.requests, number(r.rps, 2), number(lat.mean, 0),
             number(lat.p50, 0), number(lat.p90, 0), number(lat.p95, 0), number(lat.p99, 0),
             r.failures, number(r.tokens_per_s, 0), number(r.tokens_per_request, 1), batches,
             number(r.engine_batch_size, 1), percent(s[PRE]), percent(s[POST]),
             percent(r.queue_share))
        )  # fmt: skip
    return table(SUMMARY_HEADER, cells)


def _metric_listing(row: LengthResult) -> list[str]:
    """The seed's metric listing, as increases over the measured window."""
    lines = []
    for metric in (names.INFERENCE_COUNT, names.EXEC_COUNT, names.COMPUTE_INFER_DURATION_US):
        for model in MODELS:
            lines.append(
                f'{metric}{{model="{model}"}} {row.increase(sample_name(metric), model):.0f}'
            )
        lines.append("")
    for metric in (
        names.ENGINE_COMPUTE_DURATION_US,
        names.ENGINE_STEPS,
        names.ENGINE_STEP_ROWS,
        names.ENGINE_GENERATED_TOKENS,
        names.ENGINE_PROMPT_TOKENS,
        names.ENGINE_PROMPT_TOKENS_REUSED,
    ):
        value = row.increase(sample_name(metric), ENGINE_MODEL)
        lines.append(f'{metric}{{model="{ENGINE_MODEL}"}} {value:.0f}')
    received, reused = (row.increase(sample_name(m), ENGINE_MODEL) for m in _REUSE)
    return [*lines, "# " + reuse_line(received, reused)]


_REUSE = (names.ENGINE_PROMPT_TOKENS, names.ENGINE_PROMPT_TOKENS_REUSED)


def _busy(row: LengthResult, stage: str) -> str:
    share = row.busy_share.get(stage)
    return "" if share is None else _fill("busy", share=percent(share))


def _length_section(row: LengthResult) -> str:
    lat, t, s = row.latency_ms, row.triton, row.stage_share
    gptj_batch = t.batch_size[MODEL_STAGE]
    optional = []
    if row.failures:
        optional.append(_fill("failures", failures=row.failures, errors=row.locust.errors))
    stream = row.stream
    if stream and stream.ttft.requests:
        ttft, itl = stream.ttft.latency_ms, stream.inter_token.latency_ms
        optional.append(
            _fill(
                "stream",
                users=stream.users,
                ttft_mean=number(ttft.mean, 0),
                ttft_p95=number(ttft.p95, 0),
                itl_mean=number(itl.mean, 1),
                itl_p95=number(itl.p95, 0),
                gaps=stream.inter_token.requests,
            )
        )
    return _fill(
        "length",
        output_len=row.output_len,
        chart=timeseries_chart(row.output_len),
        metric_listing="\n".join(_metric_listing(row)),
        source=row.source,
        rps=number(row.rps, 2),
        requests=row.requests,
        window_s=number(row.window_s, 1),
        triton_requests=f"{t.counts[ENSEMBLE_MODEL]:.0f}",
        mean=number(lat.mean, 0),
        p50=number(lat.p50, 0),
        p95=number(lat.p95, 0),
        p99=number(lat.p99, 0),
        triton_mean=number(t.mean_request_ms, 0),
        tokens_per_s=number(row.tokens_per_s, 0),
        tokens_per_request=number(row.tokens_per_request, 1),
        batch_pre=number(t.batch_size[PRE], 2),
        batch_gptj=number(gptj_batch, 2),
        gptj_requests=f"{t.counts[MODEL_STAGE]:.0f}",
        gptj_executions=f"{t.counts[MODEL_STAGE] / gptj_batch if gptj_batch else 0:.0f}",
        batch_post=number(t.batch_size[POST], 2),
        engine_batch=number(row.engine_batch_size, 1),
        pre_share=percent(s[PRE]),
        pre_busy=_busy(row, PRE),
        post_share=percent(s[POST]),
        post_busy=_busy(row, POST),
        queue_share=percent(row.queue_share),
        engine_busy=percent(t.engine_busy, 0),
        optional="".join(f"\n{line}" for line in optional),
    )
