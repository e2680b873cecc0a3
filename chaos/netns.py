"""The chaos hosts: one network namespace per cluster process, each with its own IP on a
private bridge, and the faults between them as one nftables bridge table (chaos/netfaults.py).
Everything a run creates is named after its prefix (`rq` + 4 hex) and listed in a state file,
so teardown is complete and `cleanup()` can remove what a crashed run left behind. Root only."""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from chaos.netfaults import NetFaults, render_ruleset

log = logging.getLogger("raftmq.chaos.netns")

STATE_DIR = Path("/run/raftmq-chaos")
CMD_TIMEOUT_S = 15.0
PREFIX_RE = re.compile(r"^rq[0-9a-f]{4}$")
DELAY_QUEUE = 7  # NFQUEUE number used inside a namespace (each namespace has its own queues)


class NetError(RuntimeError):
    """A command that builds or changes the chaos network failed."""


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    try:
        p = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise NetError(f"`{' '.join(argv)}` took over {CMD_TIMEOUT_S:g} s") from None
    except FileNotFoundError:
        raise NetError(f"`{argv[0]}` is not installed: {require_root_tools()}") from None
    if check and p.returncode != 0:
        raise NetError(f"`{' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def require_root_tools() -> str | None:
    """None when chaos runs can work here; otherwise what is missing and how to get it."""
    if os.geteuid() != 0:
        return "chaos runs need root (network namespaces, nftables); run them as root"
    missing = [t for t in ("ip", "nft", "iptables", "ss") if shutil.which(t) is None]
    if missing:
        return (
            f"missing {', '.join(missing)}: `apt-get install -y iproute2 nftables iptables` "
            "(or `make deps`)"
        )
    return None


def _used_subnets() -> set[str]:
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    used = set()
    for m in re.finditer(r"inet (\d+\.\d+\.\d+)\.\d+/", out):
        used.add(m.group(1))
    return used


def _free_subnet() -> str:
    used = _used_subnets()
    for _ in range(200):
        candidate = f"10.{secrets.randbelow(150) + 99}.{secrets.randbelow(254) + 1}"
        if candidate not in used:
            return candidate
    raise NetError("no free 10.x.y.0/24 subnet for the chaos bridge")


class Net:
    """Hosts on a bridge. Use as a context manager: teardown runs on exit, on exceptions, on
    SIGTERM-driven exits and at interpreter exit (atexit), and is idempotent."""

    def __init__(
        self, hosts: Sequence[str], *, subnet: str | None = None, state_dir: Path = STATE_DIR
    ) -> None:
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError("hosts must be distinct and not empty")
        if len(hosts) > 200:
            raise ValueError("at most 200 hosts on one bridge")
        self.hosts = list(hosts)
        self.prefix = "rq" + secrets.token_hex(2)
        self.subnet = subnet or _free_subnet()
        ipaddress.ip_network(f"{self.subnet}.0/24")  # a clear error for a bad subnet
        self.bridge = f"{self.prefix}br"
        self.table = self.prefix
        self.state_file = state_dir / f"{self.prefix}.json"
        self._faults = NetFaults.none()
        self._delayers: dict[str, subprocess.Popen[bytes]] = {}
        self._up = False

    # ---- names --------------------------------------------------------------------------------

    def index(self, host: str) -> int:
        try:
            return self.hosts.index(host)
        except ValueError:
            raise KeyError(
                f"{host!r} is not a host of this run ({', '.join(self.hosts)})"
            ) from None

    def ip(self, host: str) -> str:
        return f"{self.subnet}.{10 + self.index(host)}"

    @property
    def control_ip(self) -> str:
        """The bridge's own address: the harness reaches every node through it, whatever the
        faults (they act on forwarding between ports only)."""
        return f"{self.subnet}.1"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{self.index(host)}"

    def port(self, host: str) -> str:
        return f"{self.prefix}h{self.index(host)}"

    def wrap(self, host: str) -> list[str]:
        """argv prefix that runs a command inside the host's namespace (ip netns exec replaces
        itself with the command, so the child's pid is the command's)."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # ---- lifecycle ----------------------------------------------------------------------------

    def setup(self) -> Net:
        why = require_root_tools()
        if why is not None:
            raise NetError(why)
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(
            json.dumps(
                {
                    "owner_pid": os.getpid(),
                    "prefix": self.prefix,
                    "bridge": self.bridge,
                    "table": self.table,
                    "namespaces": [self.namespace(h) for h in self.hosts],
                    "hosts": self.hosts,
                }
            )
        )
        self._up = True
        atexit.register(self.teardown)
        try:
            # nf_call_iptables 0: the root namespace's iptables FORWARD policy (Docker sets
            # DROP) must not see our bridged frames (chaos.md pitfall 13).
            _run(["ip", "link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0",
                  "nf_call_ip6tables", "0", "nf_call_arptables", "0"])  # fmt: skip
            _run(["ip", "addr", "add", f"{self.control_ip}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for h in self.hosts:
                ns, port = self.namespace(h), self.port(h)
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0",
                      "netns", ns])  # fmt: skip
                _run(["ip", "link", "set", port, "master", self.bridge, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.ip(h)}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self.apply(NetFaults.none())
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        if not self._up:
            return
        self._up = False
        for host in list(self._delayers):
            with contextlib.suppress(Exception):
                self.clear_delay(host)
        _remove(self.prefix, [self.namespace(h) for h in self.hosts], self.bridge, self.table)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)

    def __enter__(self) -> Net:
        return self.setup()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()

    # ---- faults -------------------------------------------------------------------------------

    @property
    def faults(self) -> NetFaults:
        return self._faults

    def apply(self, faults: NetFaults) -> None:
        text = render_ruleset(self.table, faults, {h: self.port(h) for h in self.hosts})
        _run(["nft", "-f", "-"], stdin=text)
        self._faults = faults

    def heal(self) -> None:
        for host in list(self._delayers):
            self.clear_delay(host)
        self.apply(NetFaults.none())

    def delay(self, host: str, delay_ms: int, jitter_ms: int = 0) -> None:
        """Hold every packet the host sends for delay_ms +- jitter_ms (this kernel has no netem:
        an NFQUEUE delayer in the host's namespace; --queue-bypass means a dead delayer lets
        packets through undelayed instead of dropping them)."""
        if host in self._delayers:
            self.clear_delay(host)
        ns = self.namespace(host)
        proc = subprocess.Popen(
            [*self.wrap(host), sys.executable, "-m", "chaos.nfq_delay", "--queue",
             str(DELAY_QUEUE), "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace")
        if not line.startswith("nfq_delay.ready"):
            proc.kill()
            raise NetError(f"the delayer in {ns} did not start: {line.strip()}")
        self._delayers[host] = proc
        _run(["ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-o", "eth0", "-j",
              "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"])  # fmt: skip

    def clear_delay(self, host: str) -> None:
        ns = self.namespace(host)
        _run(["ip", "netns", "exec", ns, "iptables", "-F", "OUTPUT"], check=False)
        proc = self._delayers.pop(host, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def cut_connections(self, host: str, peer: str | None = None) -> None:
        """Abort the host's established TCP connections (to one peer, or all) now; the peer
        learns of it only when it next sends (chaos.md pitfall 3)."""
        argv = ["ip", "netns", "exec", self.namespace(host), "ss", "-K", "-t"]
        if peer is not None:
            argv += ["dst", self.ip(peer)]
        _run(argv, check=False)


def _remove(prefix: str, namespaces: Sequence[str], bridge: str, table: str) -> list[str]:
    removed = []
    for ns in namespaces:
        pids = _run(["ip", "netns", "pids", ns], check=False).split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        # `ip netns del` does not kill what runs inside; the kills above must land first.
        for _ in range(50):
            if not _run(["ip", "netns", "pids", ns], check=False).split():
                break
            time.sleep(0.02)
        if _run(["ip", "netns", "del", ns], check=False) == "" and ns in _namespaces():
            log.warning("chaos.netns_not_deleted ns=%s", ns)
        removed.append(f"namespace {ns}")
    _run(["nft", "delete", "table", "bridge", table], check=False)
    removed.append(f"nft table bridge {table}")
    _run(["ip", "link", "del", bridge], check=False)
    removed.append(f"bridge {bridge}")
    return removed


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines()
            if line.strip()]  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(state_dir: Path = STATE_DIR, force: bool = False) -> list[str]:
    """Remove what crashed runs left: runs whose owner process is dead (every run with force),
    then any rq????-named namespace, bridge or bridge table that no live run owns."""
    if require_root_tools() is not None:
        return []
    removed: list[str] = []
    live: set[str] = set()
    for f in sorted(state_dir.glob("rq*.json")) if state_dir.exists() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            f.unlink(missing_ok=True)
            continue
        if not force and _alive(int(st.get("owner_pid", 0))):
            live.add(str(st.get("prefix")))
            continue
        removed += _remove(st["prefix"], st.get("namespaces", []), st["bridge"], st["table"])
        f.unlink(missing_ok=True)
    for ns in _namespaces():
        p = ns.split("-")[0]
        if PREFIX_RE.match(p) and p not in live:
            removed += _remove(p, [ns], f"{p}br", p)
    for line in _run(["ip", "-o", "link", "show", "type", "bridge"], check=False).splitlines():
        m = re.match(r"\d+: (rq[0-9a-f]{4})br[:@]", line)
        if m and m.group(1) not in live:
            removed += _remove(m.group(1), [], f"{m.group(1)}br", m.group(1))
    for line in _run(["nft", "list", "tables"], check=False).splitlines():
        m = re.match(r"table bridge (rq[0-9a-f]{4})$", line.strip())
        if m and m.group(1) not in live:
            _run(["nft", "delete", "table", "bridge", m.group(1)], check=False)
            removed.append(f"nft table bridge {m.group(1)}")
    return sorted(set(removed))
