"""`raftmq chaos list|run|suite|cleanup`: the chaos suite from the command line. `run` executes
one scenario and prints its one-line verdict (exit 1 on FAIL); `suite` runs the CI set or the
full list and prints a table of results; `cleanup` removes what a crashed run left behind."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from raftmq.chaos.scenarios import SCENARIOS, by_name, ci_set
from raftmq.common.errors import RaftMQError
from raftmq.ops.cli_numbers import amount
from raftmq.ops.terminal_text import literal, make_console

console = make_console()
DEFAULT_OUT = Path("chaos-results")


def _require_root() -> str | None:
    from raftmq.chaos.netns import require_root_tools

    return require_root_tools()


def list_scenarios(args: argparse.Namespace) -> int:
    t = Table(title="chaos scenarios (`make chaos` runs the CI set)")
    for col in ("scenario", "CI", "default s", "what it does"):
        t.add_column(col)
    for s in SCENARIOS:
        t.add_row(s.name, "yes" if s.ci else "", f"{s.default_duration_s:g}", s.summary)
    console.print(t)
    return 0


def _run_one(
    name: str, seed: int, duration: float | None, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from raftmq.chaos.runner import CHAOS_CLUSTER, RunError, RunOptions, run

    opts = RunOptions(
        scenario=name,
        seed=seed,
        duration_s=duration,
        out_dir=out,
        cluster=Path(args.cluster) if args.cluster else CHAOS_CLUSTER,
        rate_per_s=args.rate,
        ack_before_commit=args.ack_before_commit,
    )
    started = time.monotonic()
    try:
        r = run(opts, console=make_console(stderr=True))
    except (RunError, RaftMQError) as exc:
        console.print(f"[red]ERROR {name} seed={seed}:[/] {literal(str(exc))}", highlight=False)
        return {"scenario": name, "seed": seed, "passed": False, "error": str(exc)}
    colour = "green" if r.passed else "red"
    console.print(f"[{colour}]{literal(r.verdict)}[/]", highlight=False)
    console.print(literal(f"  result {r.result_path}  picture {r.png_path}"), highlight=False)
    q = r.report.to_json()
    return {
        "scenario": name,
        "seed": seed,
        "passed": r.passed,
        "verdict": r.verdict,
        "queue": q.get("queue", {}),
        "order": q.get("order", {}),
        "worst_failover_gap_s": r.extra["worst_failover_gap_s"],
        "wall_s": round(time.monotonic() - started, 1),
        "lifecycle": r.extra.get("lifecycle", {}),  # a lifecycle scenario's own checker
    }


def run_cmd(args: argparse.Namespace) -> int:
    if (why := _require_root()) is not None:
        console.print(f"[red]cannot run chaos scenarios here:[/] {literal(why)}", highlight=False)
        return 2
    by_name(args.scenario)  # a clear error before any setup
    out = Path(args.out) / f"{args.scenario}-seed{args.seed}"
    res = _run_one(args.scenario, args.seed, args.duration, out, args)
    return 0 if res["passed"] else 1


def suite_cmd(args: argparse.Namespace) -> int:
    if (why := _require_root()) is not None:
        console.print(f"[red]cannot run chaos scenarios here:[/] {literal(why)}", highlight=False)
        return 2
    scenarios = ci_set() if args.set == "ci" else list(SCENARIOS)
    rows = []
    for s in scenarios:
        out = Path(args.out) / f"{s.name}-seed{args.seed}"
        rows.append(_run_one(s.name, args.seed, args.duration, out, args))
    t = Table(title=f"chaos {args.set} set, seed {args.seed}")
    for col in ("scenario", "verdict", "acked", "lost", "dup", "reorder", "worst gap s", "wall s"):
        t.add_column(col)
    t.add_column("feature check")
    for r in rows:
        q, o = r.get("queue", {}), r.get("order", {})
        t.add_row(
            r["scenario"],
            "[green]PASS[/]" if r["passed"] else "[red]FAIL[/]",
            str(q.get("acked", "-")),
            str(q.get("lost", "-")),
            str(q.get("duplicated", "-")),
            str(o.get("reorder", "-")),
            str(r.get("worst_failover_gap_s", "-")),
            str(r.get("wall_s", "-")),
            str(r.get("lifecycle", {}).get("summary", "-")),
        )
    console.print(t)
    summary = Path(args.out) / f"suite-{args.set}-seed{args.seed}.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(rows, indent=1))
    console.print(f"summary {summary}", highlight=False)
    return 0 if all(r["passed"] for r in rows) else 1


def cleanup_cmd(args: argparse.Namespace) -> int:
    from raftmq.chaos.netns import NetError, cleanup

    try:
        removed = cleanup(force=args.force, only=args.run)
    except NetError as exc:
        console.print(f"[red]cleanup failed:[/] {literal(str(exc))}", highlight=False)
        return 2
    if not removed:
        console.print("nothing left behind by earlier chaos runs")
    for item in removed:
        console.print(f"removed {item}", highlight=False)
    return 0


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=1, help="seeds targets and timings (default 1)")
    p.add_argument(
        "--duration", type=amount(positive=True), default=None, help="seconds of producing"
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results directory")
    p.add_argument("--cluster", default="", help="cluster description (default chaos/cluster.toml)")
    p.add_argument(
        "--rate",
        type=amount(positive=True),
        default=20.0,
        help="sends/s per producer (3 producers)",
    )
    p.add_argument(
        "--ack-before-commit",
        action="store_true",
        help="debug build: brokers acknowledge before commit (the checker must report losses)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ch = subparsers.add_parser("chaos", help="kill, pause and partition a cluster; check history")
    sub = ch.add_subparsers(dest="chaos_command", required=True)
    p = sub.add_parser("list", help="the scenarios")
    p.set_defaults(func=list_scenarios)
    p = sub.add_parser("run", help="run one scenario (root; network namespaces)")
    p.add_argument("--scenario", required=True, help="see `raftmq chaos list`")
    _run_options(p)
    p.set_defaults(func=run_cmd)
    p = sub.add_parser("suite", help="run the CI set or the full list and print a table")
    p.add_argument("--set", choices=("ci", "full"), default="ci")
    _run_options(p)
    p.set_defaults(func=suite_cmd)
    p = sub.add_parser("cleanup", help="remove namespaces, bridges and tables of crashed runs")
    p.add_argument(
        "--force",
        action="store_true",
        help="also runs whose owner is alive or cannot be seen (another pid namespace)",
    )
    p.add_argument(
        "--run",
        default=None,
        metavar="PREFIX",
        help="only the run of this prefix (rq and four hex digits)",
    )
    p.set_defaults(func=cleanup_cmd)
