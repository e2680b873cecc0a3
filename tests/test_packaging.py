"""The distribution as users get it: built from the committed tree (a `git archive` of HEAD, so
nothing untracked or generated locally leaks in), an sdist and a wheel built from that sdist
(the role folders reach the package through the raftmq/<role> links; the sdist must keep them).

The wheel holds exactly the top-level names `raftmq` and `pyspark_raftmq`, every tracked module
of every role, the default cluster description, and a base install that is the SDK alone
(grpcio, protobuf): installed into a fresh virtualenv, the SDK imports and the server and Spark
dependencies are absent. `[server]` installs the role commands, and a NameServer starts from it.
The whole module takes ~25 s with a warm pip cache (the server case ~14 s), so none is `slow`.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftmq.common.stored_batch import NO_EXTENSIONS_ENV
from tests.harness.local_cluster import free_ports

ROOT = Path(__file__).resolve().parents[1]
ROLES = (
    "common",
    "raftlog",
    "broker",
    "controller",
    "namesrv",
    "client",
    "ops",
    "spark_source",
    "chaos",
)
# What `pip install raftmq` must not pull in: servers, tooling, Spark, build-time protoc.
NOT_IN_BASE = (
    "pyspark",
    "pyarrow",
    "lmdb",
    "pysyncobj",
    "matplotlib",
    "rich",
    "cryptography",
    "grpcio-tools",
    "aiohttp",
)
SDK_IMPORT = (
    "from raftmq import Producer, PushConsumer, PullConsumer, Admin, ConsumeResult, "
    "StartFrom, RaftMQError"
)
PIP_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Dists:
    source: Path  # the committed tree, extracted
    sdist: Path
    wheel: Path  # built from the sdist, as `python -m build` does


def _run(
    argv: list[str], cwd: Path, timeout_s: float = 300, extra_env: dict[str, str] | None = None
) -> str:
    # The build is the default one whatever this run forces: setup.py skips mypyc when the
    # suite runs with the twins forced (RAFTMQ_NO_EXTENSIONS), and these tests check the wheel.
    dropped = ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV", NO_EXTENSIONS_ENV)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env |= extra_env or {}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(argv)} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _has_build() -> bool:
    try:
        import build  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the committed tree is what gets built")
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    source.mkdir()
    archive = base / "head.tar"
    _run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), "HEAD"], ROOT)
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")  # keeps the relative raftmq/<role> links
    assert (source / "raftmq" / "client").is_symlink(), "the archive lost the raftmq/ links"
    out = base / "dist"
    if _has_build():  # the dev extra: sdist, then the wheel from the sdist
        _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."], source)
    else:
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
              "-w", str(out), "."], source)  # fmt: skip
    wheels = list(out.glob("raftmq-*.whl"))
    sdists = list(out.glob("raftmq-*.tar.gz"))
    assert len(wheels) == 1, f"expected one wheel in {sorted(out.iterdir())}"
    return Dists(source, sdists[0] if sdists else Path(), wheels[0])


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(f".dist-info/{name}")]
        return z.read(path).decode()


def test_top_level_names_are_raftmq_and_the_spark_module(dists: Dists) -> None:
    assert set(_dist_info(dists.wheel, "top_level.txt").split()) == {"raftmq", "pyspark_raftmq"}
    tops = {
        row.split(",")[0].split("/")[0]
        for row in _dist_info(dists.wheel, "RECORD").splitlines()
        if row and ".dist-info/" not in row.split(",")[0]
    }
    assert tops == {"raftmq", "pyspark_raftmq.py"}


def test_the_wheel_holds_every_role_module_and_the_data(dists: Dists) -> None:
    names = set(_wheel_names(dists.wheel))
    tracked = _run(["git", "-C", str(ROOT), "ls-files", "--", *ROLES], ROOT).split()
    modules = [p for p in tracked if p.endswith((".py", ".pyi"))]
    assert len(modules) > 50
    missing = sorted(p for p in modules if f"raftmq/{p}" not in names)
    assert not missing, (
        f"tracked modules left out of the wheel (the links not followed?): {missing}"
    )
    for data in (
        "pyspark_raftmq.py",
        "raftmq/__init__.py",
        "raftmq/py.typed",
        "raftmq/ops/cluster.toml",  # the default cluster description of `raftmq cluster up`
        "raftmq/client/producer/__init__.py",
        "raftmq/common/pb/common_pb2.py",
    ):
        assert data in names, f"{data} is not in the wheel"
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]


def test_the_sdist_keeps_the_role_folders_under_raftmq(dists: Dists) -> None:
    if dists.sdist == Path():
        pytest.skip("built with pip wheel (the build package is not installed): no sdist")
    with tarfile.open(dists.sdist) as tar:
        names = set(tar.getnames())
    prefix = dists.sdist.name.removesuffix(".tar.gz")
    for role in ROLES:
        assert f"{prefix}/raftmq/{role}/__init__.py" in names, f"the sdist lost raftmq/{role}"
    assert f"{prefix}/raftmq/ops/cluster.toml" in names


def _base_requirements(metadata: str) -> list[str]:
    reqs = [
        line.removeprefix("Requires-Dist:").strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return [r for r in reqs if "extra ==" not in r]


def test_the_base_install_is_the_sdk_alone(dists: Dists) -> None:
    base = _base_requirements(_dist_info(dists.wheel, "METADATA"))
    names = {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower() for r in base}
    # typeguard: the SDK's argument checks (common/arguments.py); pure Python, no dependencies;
    # crc32c: the stored batch's CRC-32C (common/stored_batch.py), wheels for every platform
    assert names == {"grpcio", "protobuf", "typeguard", "crc32c"}, base
    assert not names & set(NOT_IN_BASE)


@dataclass(frozen=True, slots=True)
class Env:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def run(self, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        # The installed package decides for itself: not the caller's path, nor its forcing of
        # the twin (the suite also runs under RAFTMQ_NO_EXTENSIONS=1: issue 24's bar 3).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", NO_EXTENSIONS_ENV)}
        return subprocess.run(
            [str(self.python), "-c", code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _new_env(path: Path) -> Env:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return Env(path)


def _pip_install(env: Env, requirement: str, cwd: Path) -> None:
    # pip may warn about the machine's extra index locations; only the exit code matters.
    _run(
        [str(env.python), "-m", "pip", "install", "--disable-pip-version-check", requirement],
        cwd,
        PIP_TIMEOUT_S,
    )


def test_the_sdk_installs_alone_into_an_empty_virtualenv(dists: Dists, tmp_path: Path) -> None:
    env = _new_env(tmp_path / "venv")
    _pip_install(env, str(dists.wheel), tmp_path)
    done = env.run(f"{SDK_IMPORT}\nimport raftmq; print(raftmq.__file__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(env.root), "imported another raftmq"
    assert env.run(CODEC_IMPLEMENTATION, tmp_path).stdout.strip() == "c"  # built with gcc here
    for module in ("lmdb", "pysyncobj", "pyspark", "pyarrow", "rich", "matplotlib"):
        gone = env.run(f"import {module}", tmp_path)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, (
            f"{module} is importable after a base install"
        )
    # The commands the wheel installs say which extra they need (issue 26: they crashed with
    # "No module named 'rich'").
    for command, extra in (
        ("raftmq", "cli"),
        ("raftmq-broker", "server"),
        ("raftmq-namesrv", "server"),
        ("raftmq-controller", "server"),
    ):  # raftmq-proxy needs only the base install
        ran = subprocess.run(
            [str(env.bin(command)), "--help"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
        assert f"pip install 'raftmq[{extra}]'" in ran.stderr, ran.stderr


# Which stored batch codec the installed package runs, after a round trip through it.
CODEC_IMPLEMENTATION = """
from raftmq.common import stored_batch as s
from raftmq.common.message import Message
raw = bytearray(s.encode_batch("t", 1, [Message("t", b"x", "tag")]))
s.check_batch(raw)
s.stamp(raw, 7, 8)
assert [(m.queue_offset, m.body) for m in s.iter_messages(raw)] == [(7, b"x")]
print(s.IMPLEMENTATION)
"""


def test_the_wheel_holds_the_compiled_codec(dists: Dists) -> None:
    compiled = [
        n for n in _wheel_names(dists.wheel) if n.startswith("raftmq/common/_stored_batch_c.")
    ]
    assert any(n.endswith((".so", ".pyd")) for n in compiled), compiled
    assert "raftmq/common/_stored_batch_c.pyi" in compiled


def test_the_wheel_holds_the_raft_core_compiled_with_its_manifest(dists: Dists) -> None:
    """mypyc's modules, their shared library inside raftmq.raftlog (found wherever the package is
    installed) and the hashes of the sources they were built from (raftlog/compiled.py)."""
    names = set(_wheel_names(dists.wheel))
    for module in (
        "raft_core",
        "raft_codec",
        "raft_messages",
        "election",
        "replication",
        "core__mypyc",
    ):
        assert any(
            n.startswith(f"raftmq/raftlog/{module}.") and n.endswith((".so", ".pyd")) for n in names
        ), module
        if module != "core__mypyc":
            assert f"raftmq/raftlog/{module}.py" in names, module  # the twin
    assert "raftmq/raftlog/_mypyc_manifest.json" in names
    assert not [n for n in names if "__mypyc" in n and not n.startswith("raftmq/")]


def test_a_wheel_built_without_a_compiler_runs_on_the_twin(dists: Dists, tmp_path: Path) -> None:
    """The extension is optional: with no working compiler the build warns, the wheel has no
    extension, and the installed SDK runs the pure-Python twin."""
    source = tmp_path / "src"
    shutil.copytree(dists.source, source, symlinks=True)
    out = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "-w", str(out), "."], source, extra_env={"CC": str(tmp_path / "no-such-cc")})  # fmt: skip
    (wheel,) = out.glob("raftmq-*.whl")
    assert not [n for n in _wheel_names(wheel) if n.endswith((".so", ".pyd"))]
    env = _new_env(tmp_path / "venv")
    _pip_install(env, str(wheel), tmp_path)
    done = env.run(CODEC_IMPLEMENTATION, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "python"


def _free_port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def nameserver_argv(dists: Dists, tmp_path: Path) -> Iterator[tuple[Env, list[str]]]:
    env = _new_env(tmp_path / "venv")
    _pip_install(env, f"{dists.wheel}[server]", tmp_path)
    yield env, [str(env.bin("raftmq-namesrv")), "--listen", f"127.0.0.1:{_free_port()}"]
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def test_the_server_extra_runs_a_nameserver(
    nameserver_argv: tuple[Env, list[str]], tmp_path: Path
) -> None:
    env, argv = nameserver_argv
    for role in ("raftmq-broker", "raftmq-namesrv", "raftmq-controller"):
        _run([str(env.bin(role)), "--help"], tmp_path, 60)
    clean = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RAFTMQ_")
    }
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
        assert line.startswith("namesrv.started listen=127.0.0.1:"), line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
