"""``python -m evaluation`` (``make eval``): HumanEval through a served model and alone.

    python -m evaluation --url http://127.0.0.1:8080/v1 \\
        --checkpoint model_repository/gptj/1/checkpoint [--quick] [--limit N] [--out eval/results]

Without ``--url`` it starts the OpenAI-compatible API and Triton on free ports of 127.0.0.1 (as
`make api` does), and stops them at the end. The report goes to a new folder under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from evaluation import report, run
from evaluation.instruct import humaneval_instruct
from evaluation.launch import ServedModel
from evaluation.local import LocalModel, describe_checkpoint
from evaluation.problems import HUMANEVAL_STOPS, QUICK_EVERY, load_problems, select
from evaluation.served import CompletionsClient
from serving.paths import DEFAULT_CHECKPOINT, MODEL_REPOSITORY, checkpoint_dir


def parse(argv: list[str] | None) -> argparse.Namespace:
    defaults = run.Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        help="an OpenAI-compatible base URL (http://127.0.0.1:8080/v1); "
        "none: start the API and Triton here",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help="the served checkpoint, run alone by transformers",
    )
    parser.add_argument("--out", type=Path, default=Path("eval/results"))
    parser.add_argument("--quick", action="store_true", help=f"every {QUICK_EVERY}th problem")
    parser.add_argument("--limit", type=int, help="at most N problems (after --quick)")
    parser.add_argument("--model", help="the model name to send (default: /v1/models' first)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--line-max-tokens", type=int, default=defaults.line_max_tokens)
    parser.add_argument(
        "--instruct-max-tokens",
        type=int,
        default=defaults.instruct_max_tokens,
        help="an instruct HumanEval answer's budget (a model with a chat template)",
    )
    parser.add_argument(
        "--instruct-compare",
        type=int,
        help="transformers answers only the first N instruct problems (a 512-token answer "
        "takes it minutes on 2 cores; the served side answers them all)",
    )
    parser.add_argument(
        "--no-lines", action="store_true", help="skip the next-line and infilling sections"
    )
    parser.add_argument(
        "--timeout", type=float, default=defaults.timeout, help="seconds one program may run"
    )
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument(
        "--transformers",
        choices=run.TRANSFORMERS_MODES,
        default=defaults.transformers,
        help="run the checkpoint alone for both generation sections (all), "
        "HumanEval only, or not at all",
    )
    parser.add_argument(
        "--no-token-healing",
        action="store_true",
        help="send token_healing false with every completion, and run transformers without "
        "it (default: the server's default, on here, and transformers healing as it does)",
    )
    parser.add_argument(
        "--server-settings",
        help="what the server runs (backend, precision), "
        "for the report when the server does not say",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=MODEL_REPOSITORY,
        help="what the server started without --url serves",
    )
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    return args


def selection(args: argparse.Namespace) -> str:
    parts = [f"every {QUICK_EVERY}th"] if args.quick else []
    parts += [f"the first {args.limit}"] if args.limit else []
    return ", ".join(parts) or "all"


def evaluate(args: argparse.Namespace, url: str, started_here: bool) -> dict[str, Any]:
    """Every section through the server at ``url`` (and transformers), as the report's data."""
    begin = time.monotonic()
    settings = run.Settings(
        max_tokens=args.max_tokens,
        line_max_tokens=args.line_max_tokens,
        instruct_max_tokens=args.instruct_max_tokens,
        lines=not args.no_lines,
        timeout=args.timeout,
        concurrency=args.concurrency,
        transformers=args.transformers,
        token_healing=not args.no_token_healing,
        instruct_compare=args.instruct_compare,
    )
    problems = select(load_problems(), args.quick, args.limit)
    cases = run.all_cases(problems)
    have_checkpoint = (args.checkpoint / "config.json").is_file()
    if settings.transformers != "none" and not have_checkpoint:
        raise SystemExit(
            f"no checkpoint at {args.checkpoint} to run alone: pass --checkpoint "
            "or --transformers none"
        )
    budget = run.Budget(args.checkpoint if have_checkpoint else None)
    with CompletionsClient(url, args.model, token_healing=settings.token_healing) as client:
        server = {
            **client.describe(),
            "started_here": started_here,
            "settings_given": args.server_settings,
        }
        sandbox = run.sandbox_check(problems, settings)
        local = (
            LocalModel(args.checkpoint, healing=settings.token_healing)
            if settings.transformers != "none"
            else None
        )
        humaneval = run.humaneval(problems, client, local, budget, settings)
        chats = chat_flag(server.get("models"))
        instruct = humaneval_instruct(problems, client, local, budget, settings, chats)
        next_line = infill = None
        if settings.lines:
            line_local = local if settings.transformers == "all" else None
            next_line = run.next_line(cases, client, line_local, budget, settings)
            prefix_only = [row["served"] for row in next_line["cases"]]
            infill = run.infill(problems, cases, prefix_only, client, budget, settings)
    notes = {
        "all": "float32, greedy, every generation section",
        "none": "not run",
        "humaneval": "float32, greedy, HumanEval only",
    }
    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "duration_s": time.monotonic() - begin,
        "machine": report.machine(),
        "model": describe_checkpoint(args.checkpoint),
        "server": server,
        "settings": {
            "problems": len(problems),
            "selection": selection(args),
            "max_tokens": settings.max_tokens,
            "instruct_max_tokens": settings.instruct_max_tokens,
            "line_max_tokens": settings.line_max_tokens,
            "stops": list(HUMANEVAL_STOPS),
            "timeout": settings.timeout,
            "concurrency": settings.concurrency,
            "token_healing": "server default" if settings.token_healing else "off",
            "transformers": settings.transformers,
            "transformers_note": notes[settings.transformers],
        },
        "sandbox": sandbox,
        "humaneval": humaneval,
        "humaneval_instruct": instruct,
        "next_line": next_line,
        "infill": infill,
    }


def chat_flag(models: Any) -> bool | None:
    """Whether ``/v1/models`` says the first model chats (None when it does not say)."""
    try:
        return models["data"][0].get("chat")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def new_folder(out: Path) -> Path:
    """A folder of this run's own under ``out``, named by the time: two runs started in the same
    second (side by side) get two folders, not one that the later report overwrites."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = out / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise SystemExit(f"no free folder for {stamp} under {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = new_folder(args.out)
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            if args.checkpoint.resolve() != checkpoint_dir(args.model_repository).resolve():
                print(
                    f"note: the server will serve {checkpoint_dir(args.model_repository)}, "
                    f"transformers runs {args.checkpoint}",
                    file=sys.stderr,
                )
            server = ServedModel(args.model_repository, args.checkpoint, folder / "server.log")
            print(
                f"starting the API and Triton on 127.0.0.1:{server.port} (log: "
                f"{server.log_file}) ...",
                file=sys.stderr,
            )
            stack.enter_context(server)
            url = server.url
        data = evaluate(args, url, started_here=args.url is None)
    as_json, as_md = report.write(data, folder)
    print(f"\n{report.markdown(data)}\n\nreport: {as_md}\n        {as_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
