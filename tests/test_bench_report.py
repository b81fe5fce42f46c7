"""`python -m bench NAME`: the report is updated for the benchmarks run and keeps the others' sections."""

from __future__ import annotations

import json
from pathlib import Path

from bench._results import Results
from bench.report import Machine, render
from bench.suite import STEPS, StepRun, earlier_run, with_earlier_runs

STEP = {step.name: step for step in STEPS}


def saved(data: Path, logs: Path, name: str, metric: str, run: dict[str, object] | None) -> None:
    results = Results(name, name)
    results.add(metric, "1,234", ">= 1", "MEETS", value=1234.0)
    results.write(str(data / f"{name}.json"))
    (logs / f"{name}.log").write_text(f"$ python -m bench.{name} --old\nits output\n")
    if run is not None:
        (data / f"{name}.run.json").write_text(json.dumps(run))


def test_a_report_for_one_benchmark_keeps_the_others(tmp_path: Path) -> None:
    data, logs = tmp_path / "data", tmp_path / "logs"
    data.mkdir()
    logs.mkdir()
    earlier = {"command": "python -m bench.registration", "seconds": 23.0, "exit_code": 0}
    saved(data, logs, "registration", "Register p50", {**earlier, "finished": "2026-12-01 10:00 UTC"})
    saved(data, logs, "latency", "p99 latency", None)  # a folder from before runs were saved
    saved(data, logs, "listener_decode", "decode rate", None)  # not a default step: not kept
    now = Results("marmot", "Marmot")
    now.add("ours/bare, 1 token(s)", "80%", ">= 70%", "MEETS", value=0.8)
    marmot = StepRun(
        STEP["marmot"], "python -m bench.marmot", 41.0, 0, logs / "marmot.log", now.to_dict(), "today"
    )

    runs = with_earlier_runs([marmot], data, logs)

    assert [run.step.name for run in runs] == ["registration", "latency", "marmot"]  # the suite's order
    registration, latency = runs[0], runs[1]
    assert (registration.command, registration.seconds, registration.finished) == (
        "python -m bench.registration",
        23.0,
        "2026-12-01 10:00 UTC",
    )
    assert latency.command == "python -m bench.latency --old" and latency.finished == ""
    report = render(Machine("now"), runs, tmp_path, "python -m bench marmot", False, None, 42.0, ["marmot"])
    assert "`python -m bench marmot` (full sizes and durations); updated marmot in 0.7 min" in report
    assert "ran 2026-12-01 10:00 UTC; 23 s, exit 0" in report
    assert "| Register p50 | 1,234 | >= 1 | MEETS |" in report
    assert "| p99 latency | 1,234 | >= 1 | MEETS |" in report
    assert "? s, exit 0" in report  # its time was not saved
    assert "ran today; 41 s, exit 0" in report
    assert "| ours/bare, 1 token(s) | 80% | >= 70% | MEETS |" in report
    assert "decode rate" not in report


def test_no_earlier_run_without_its_numbers(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "marmot.log").write_text("$ python -m bench.marmot\n")
    assert earlier_run(STEP["marmot"], tmp_path / "data", tmp_path / "logs") is None


def test_the_figure_is_kept_only_when_nothing_drawn_in_it_ran_again(tmp_path: Path) -> None:
    from bench.__main__ import keeps_plot
    from bench.report import PLOT_NAME

    assert not keeps_plot(["marmot"], tmp_path)  # no figure to keep
    (tmp_path / PLOT_NAME).write_bytes(b"\x89PNG")
    assert keeps_plot(["marmot", "matrix"], tmp_path)
    assert not keeps_plot(["marmot", "latency"], tmp_path)
    assert not keeps_plot(["channels-apns"], tmp_path)
