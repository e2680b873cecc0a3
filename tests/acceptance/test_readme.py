"""The README's snippets run (issue 13 item 6): its `raftmq` command blocks and its Python blocks,
in README order, against the acceptance cluster (tests/acceptance/cluster.py). A snippet that
raises, exits non-zero or hangs fails the test, naming the README line.

How a README block becomes a run (tests/harness/readme.py has the rules):
- the NameServer addresses `127.0.0.1:9876,127.0.0.1:9877` (and `127.0.0.1:9876`) become the
  test cluster's (`substitute`); a `raftmq ARGS` line runs as `python -m raftmq.ops.cli ARGS`
  with RAFTMQ_NAMESRV set to them;
- each Python block runs in a fresh interpreter, its line numbers kept (a traceback says
  `File "README.md", line N`); a placeholder statement `...` waits until the block printed
  something, at most PLACEHOLDER_WAIT_S;
- blocks marked `<!-- readme-test: spark -->` run in tests/spark/test_readme_spark.py, blocks
  marked `<!-- readme-test: skip ... -->` nowhere; a sh block with any line that is not a
  `raftmq` command (`make run`, `make test`) is not run: it starts or tests the whole project.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftmq.ops.cluster_spec import parse
from tests.harness.procs import Cluster
from tests.harness.readme import (
    README,
    WAIT_CALL,
    Block,
    blocks,
    cli_commands,
    readme_blocks,
    substitute,
    with_bounded_waits,
)

ROOT = README.parent
SHIPPED_SPEC = ROOT / "ops" / "cluster.toml"  # what `make run` starts
PLACEHOLDER_WAIT_S = 15.0
BLOCK_TIMEOUT_S = 120.0
# Runs before a block: `__readme_wait__()` returns once the block printed a line (from any
# thread, e.g. a consumer's listener), or after PLACEHOLDER_WAIT_S.
PRELUDE = f"""\
import sys as _sys, threading as _threading

class _Seen:
    def __init__(self, out):
        self.out, self.printed = out, _threading.Event()
    def write(self, s):
        if s.strip():
            self.printed.set()
        return self.out.write(s)
    def flush(self):
        self.out.flush()

_sys.stdout = _Seen(_sys.stdout)

def __readme_wait__():
    _sys.stdout.printed.wait({PLACEHOLDER_WAIT_S})
"""


def _env(cluster: Cluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    env["PYTHONPATH"] = str(ROOT)
    env["RAFTMQ_NAMESRV"] = cluster.namesrv
    return env


def _run_python(block: Block, cluster: Cluster, tmp_path: Path) -> str:
    code = with_bounded_waits(substitute(block.code, cluster.namesrv))
    snippet = tmp_path / f"readme_{block.line}.txt"
    snippet.write_text("\n" * block.line + code)  # its first line is README line block.line + 1
    script = tmp_path / f"readme_{block.line}.py"
    script.write_text(
        f"{PRELUDE}\n_code = open({str(snippet)!r}).read()\n"
        'exec(compile(_code, "README.md", "exec"), '
        '{"__name__": "__main__", "__readme_wait__": __readme_wait__})\n'
    )
    done = _subprocess([sys.executable, str(script)], cluster, tmp_path, block)
    if WAIT_CALL in code and "print(" in code:
        assert done.strip(), f"{block.name}: the block printed nothing within its wait"
    return done


def _run_cli(block: Block, cluster: Cluster, tmp_path: Path) -> str:
    commands = cli_commands(Block(block.lang, substitute(block.code, cluster.namesrv), 0, ""))
    assert commands is not None
    out = []
    for args in commands:
        out.append(
            _subprocess([sys.executable, "-m", "raftmq.ops.cli", *args], cluster, tmp_path, block)
        )
    return "".join(out)


def _subprocess(argv: list[str], cluster: Cluster, cwd: Path, block: Block) -> str:
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=_env(cluster),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.name} did not finish within {BLOCK_TIMEOUT_S} s: {argv[2:]}\n{exc}")
    if done.returncode != 0:
        pytest.fail(
            f"{block.name} failed (exit {done.returncode}): {argv[2:] or ''}\n"
            f"--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    return done.stdout


def test_the_readme_shows_what_this_test_runs() -> None:
    every = blocks(README.read_text())
    python = readme_blocks("python")
    cli = [b for b in readme_blocks("sh") if cli_commands(b) is not None]
    assert python, "no ```python block without a readme-test tag in README.md"
    shown = {
        " ".join(c[:2]) if c[0] == "topic" else c[0] for b in cli for c in cli_commands(b) or []
    }
    assert {"topic create", "produce", "consume"} <= shown, shown
    for b in every:  # every block is run here, in tests/spark, or marked as not run
        assert b.lang in ("python", "sh", "toml", "javascript", "yaml"), (
            f"{b.name}: no rule for this language"
        )
        if b.lang == "toml":  # cluster description settings: parsed, keys checked, as shown
            parse(SHIPPED_SPEC.read_text() + "\n" + b.code, source=b.name)
        # sparkregister: run from another directory by tests/spark/test_worker_python.py;
        # rmq5: the official RocketMQ 5 client, by tests/proxy/test_official_client.py;
        # rmq5node (javascript): the official Node.js client, by tests/proxy/test_nodejs_client.py;
        # secure: the secure-cluster recipe, by tests/ops/test_secure_recipe.py; acl: a denial's
        # output, by tests/ops/test_security_cluster.py
        known = (
            "",
            "spark",
            "sparkregister",
            "sparkupdate",
            "skip",
            "rmq5",
            "rmq5node",
            "secure",
            "acl",
        )
        assert b.lang != "javascript" or b.tag == "rmq5node", f"{b.name}: no rule for this block"
        # yaml: another tool's configuration (Prometheus' scrape config), shown, never run
        assert b.lang != "yaml" or b.tag == "skip", f"{b.name}: a yaml block must say skip"
        assert b.tag in known, f"{b.name}: unknown readme-test tag {b.tag!r}"


def test_the_readme_snippets_run_in_order(cluster: Cluster, tmp_path: Path) -> None:
    ran = []
    for block in blocks(README.read_text()):
        if block.tag:
            continue  # spark: tests/spark/test_readme_spark.py; skip: marked in the README
        if block.lang == "python":
            _run_python(block, cluster, tmp_path)
        elif block.lang == "sh" and cli_commands(block) is not None:
            _run_cli(block, cluster, tmp_path)
        else:
            continue  # `make run` / `make test`: the whole project, not a snippet
        ran.append(block.name)
    print("ran:", ", ".join(ran))
    assert ran, "no README block ran"
