"""`python -m bench`: the end-to-end benchmarks in sequence, each on a fresh database, and a report.

    python -m bench [--quick] [--only NAME,...] [--out DIR] [NAME ...]
    python -m bench NAME [that benchmark's own options, e.g. matrix --duration 300]

Runs registration, subscriber_plan, the pipeline's throughput scenario (memory mode, redis with 1 and with 2
workers), its fanout scenario (redis, 100,000 subscribers) and latency scenario (redis, 1000 hints/s for
30 s), then channels (APNs, FCM) and marmot (triggers through a relay, 1 and 10 tokens each; alone:
`python -m bench marmot`), and matrix (the Matrix gateway against a bare aioapns loop). Each is its own `python -m bench.<script>` process writing its numbers with
`--json`; the whole output of each goes to DIR/logs/, its numbers to DIR/data/. Writes DIR/report.md
(the machine, one table per benchmark with the command that reproduces it) and DIR/throughput-latency.png.
Naming benchmarks (`--only`, NAME) updates their sections only: the report keeps every other benchmark's
section from the numbers DIR/data/ holds from an earlier run, each with its own date.
Progress goes to stderr. `--quick` runs small sizes and short durations: a smoke run of a few minutes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.report import PLOT_NAME, Machine, render
from bench.suite import (
    ROOT,
    STEPS,
    Step,
    StepRun,
    command_line,
    interpreter,
    progress,
    run_step,
    select,
    verdict_counts,
    with_earlier_runs,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and short durations (smoke run)")
    names = ", ".join(s.name if s.default else f"{s.name} (not by default)" for s in STEPS)
    parser.add_argument("--only", metavar="NAME,...", help=f"run only these, comma-separated: {names}")
    parser.add_argument("names", nargs="*", metavar="NAME", help="the same as --only NAME,...")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "report", help="report folder (default bench/report/)"
    )
    parser.add_argument("--list", action="store_true", help="print the commands that would run, and stop")
    args, extra = parser.parse_known_args(argv)
    args.extra = tuple(extra)  # options for the one benchmark named
    return args


def suite_command(args: argparse.Namespace) -> str:
    words = [interpreter(), "-m", "bench"]
    words += ["--quick"] if args.quick else []
    words += ["--only", args.only] if args.only else []
    return shlex.join([*words, *args.extra])


def write_plot(runs: list[StepRun], out: Path, title: str) -> str | None:
    """Draw the figure; None when written, else why not (the report says so instead of showing it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "not drawn: matplotlib is not installed (`pip install -e '.[bench]'`)"
    from bench.plot import draw

    draw(runs, out / PLOT_NAME, title)
    return None


def keeps_plot(updated: list[str], out: Path) -> bool:
    """Whether the figure in `out` stays true after updating these benchmarks: none of them is drawn."""
    from bench.plot import BARS, LATENCY_STEP

    return (out / PLOT_NAME).exists() and not {LATENCY_STEP, *BARS} & set(updated)


def run_all(args: argparse.Namespace, steps: list[Step], out: Path) -> list[StepRun]:
    data_dir, log_dir = out / "data", out / "logs"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[StepRun] = []
    started = time.monotonic()
    for number, step in enumerate(steps, 1):
        run = run_step(step, args.quick, data_dir, log_dir, f"{number}/{len(steps)}")
        runs.append(run)
        elapsed = time.monotonic() - started
        progress(
            f"{number}/{len(steps)} {step.name}: done in {run.seconds:.0f} s, {verdict_counts(run)}; "
            f"elapsed {elapsed / 60:.1f} min"
        )
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.names:
        args.only = ",".join([*([args.only] if args.only else []), *args.names])
    steps = select(args.only)
    if args.extra:
        if len(steps) != 1:
            raise SystemExit(f"options for one benchmark ({' '.join(args.extra)}) need exactly one NAME")
        steps = [replace(steps[0], full=steps[0].full + args.extra, quick=steps[0].quick + args.extra)]
    if args.list:
        for step in steps:
            print(f"{step.name}: {command_line(step, args.quick)}")
        return 0
    out = args.out.resolve()
    machine = Machine.describe()
    progress(f"{len(steps)} benchmark(s){' (quick)' if args.quick else ''}; report in {out}")
    started = time.monotonic()
    runs = run_all(args, steps, out)
    updated = [run.step.name for run in runs] if args.only else None
    if updated is not None:  # a report of some benchmarks: the others' sections are kept
        runs = with_earlier_runs(runs, out / "data", out / "logs")
    title = f"xmtp-push benchmarks, {machine.date}" + (" (quick mode)" if args.quick else "")
    plot_note = write_plot(runs, out, title)
    if plot_note is not None and updated is not None and keeps_plot(updated, out):
        plot_note = None  # the figure already there was drawn from numbers this run left unchanged
    report = render(
        machine,
        runs,
        out,
        suite_command(args),
        args.quick,
        plot_note,
        time.monotonic() - started,
        updated,
    )
    (out / "report.md").write_text(report)
    progress(
        f"wrote {out / 'report.md'}"
        + (f" and {out / PLOT_NAME}" if plot_note is None else f"; plot {plot_note}")
    )
    failed = [r.step.name for r in runs if not r.ok]
    if failed:
        progress(f"no results from: {', '.join(failed)} (see their logs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
