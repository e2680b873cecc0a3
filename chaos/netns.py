"""The chaos hosts: one network namespace per cluster process, each with its own IP on a private
bridge, and the faults between them as one nftables bridge table (chaos/netfaults.py) plus an
NFQUEUE delayer per delayed host. Everything a run creates is named after its prefix (`rq` + 4
hex) and recorded before it exists, so teardown is complete and `cleanup()` finds what a crashed
run left. Root only; touches nothing in the root namespace but one bridge and one nft table."""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

from raftmq.chaos.netfaults import NetFaults, render_ruleset
from raftmq.ops.procs import child_env

log = logging.getLogger("raftmq.chaos.netns")

STATE_DIR = Path("/run/raftmq-chaos")
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts named namespaces
SYS_NET = Path("/sys/class/net")  # the root namespace's interfaces, read without a subprocess
CMD_TIMEOUT_S = 10.0
DELAYER_START_TIMEOUT_S = 10.0
DELAYER_STOP_TIMEOUT_S = 3.0
KILL_WAIT_S = 3.0
DELAY_QUEUE = 7  # NFQUEUE number; queues are per namespace, so one number serves every host
MAX_HOSTS = 240  # addresses .10 .. .249; .1 is the bridge (control address)
SUBNET_SECOND_OCTETS = range(99, 251)  # 10.99.x.0/24 .. 10.250.x.0/24
ALIAS_TAG = "raftmq-chaos"
PREFIX_RE = re.compile(r"^rq[0-9a-f]{4}$")
NS_RE = re.compile(r"^(rq[0-9a-f]{4})-\d+$")
LINK_RE = re.compile(r"^(rq[0-9a-f]{4})(?:br|h\d+)$")
TABLE_RE = re.compile(r"^table bridge (rq[0-9a-f]{4})$")
ALIAS_RE = re.compile(rf"^{ALIAS_TAG} owner=(\d+) start=(\d+) pidns=(\d+) run=[0-9a-f]+$")
_GONE = ("Cannot find device", "No such device", "No such file or directory", "does not exist")
LINK_GROUP_BASE = 0x52510000  # "RQ" << 16: a run's links share group BASE + its prefix's hex


def _link_group(prefix: str) -> int:
    return LINK_GROUP_BASE + int(prefix[2:], 16)


class NetError(RuntimeError):
    """A command that builds, changes or removes the chaos network failed (the system's fault,
    not the caller's). Names the command and carries its stderr."""

    def __init__(self, message: str, argv: Sequence[str] = (), stderr: str = "") -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.stderr = stderr


def require_root_tools() -> str | None:
    """None when chaos networks can be built here; otherwise what is missing and how to get it
    (tests skip with this message: never silently)."""
    if os.geteuid() != 0:
        return "chaos networks need root (network namespaces, nftables): run as root"
    tools = {"ip": "iproute2", "ss": "iproute2", "nft": "nftables", "iptables": "iptables"}
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        debs = sorted({tools[t] for t in missing})
        return (
            f"missing {', '.join(missing)}: `apt-get install -y {' '.join(debs)}` (or `make debs`)"
        )
    return None


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True,
         timeout_s: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = " ".join(argv)
    try:
        p = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise NetError(f"`{cmd}` took over {timeout_s:g} s", argv) from None
    except FileNotFoundError:
        raise NetError(f"`{argv[0]}` is not installed: {require_root_tools()}", argv) from None
    if check and p.returncode != 0:
        raise NetError(f"`{cmd}` failed ({p.returncode}): {p.stderr.strip()}", argv, p.stderr)
    return p


def _run_all(commands: Sequence[tuple[Sequence[str], str | None]]) -> None:
    """Runs the commands side by side (one per namespace: setup time does not grow with a
    process start per host in series); raises for the first that failed, after all ended."""
    started: list[tuple[Sequence[str], str | None, subprocess.Popen[str]]] = []
    for argv, stdin in commands:
        try:
            p = subprocess.Popen(
                list(argv), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            )  # fmt: skip
        except FileNotFoundError:
            for _, _, q in started:
                q.kill()
                q.communicate()
            raise NetError(f"`{argv[0]}` is not installed: {require_root_tools()}", argv) from None
        started.append((argv, stdin, p))
    errors: list[NetError] = []
    deadline = time.monotonic() + CMD_TIMEOUT_S
    for argv, stdin, p in started:
        cmd = " ".join(argv)
        try:
            _, err = p.communicate(stdin, timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            errors.append(NetError(f"`{cmd}` took over {CMD_TIMEOUT_S:g} s", argv))
            continue
        if p.returncode != 0:
            errors.append(NetError(f"`{cmd}` failed ({p.returncode}): {err.strip()}", argv, err))
    if errors:
        raise errors[0]


# ---- processes and ownership -----------------------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None if it does not exist): with the
    pid it names a process uniquely, so a recycled pid is not taken for a live owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may itself hold spaces.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _pid_namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid)."""
    return os.stat("/proc/self/ns/pid").st_ino


def _owner_alive(pid: int, start_ticks: int, pidns: int) -> bool:
    """Whether the run's owner still runs. An owner in another pid namespace (another container
    sharing this network namespace, say) cannot be seen from here, so it cannot be shown dead:
    it counts as alive, and only `force` removes its run."""
    if pidns != _pid_namespace():
        return True
    return pid > 0 and _start_ticks(pid) == start_ticks


def _pids_in(namespaces: Sequence[str]) -> list[int]:
    """Every process whose network namespace is one of these: what `ip netns pids` reports,
    read from /proc in one pass instead of one subprocess per namespace."""
    keys = set()
    for ns in namespaces:
        with contextlib.suppress(OSError):  # already deleted: nothing can be inside it
            st = os.stat(NETNS_DIR / ns)
            keys.add((st.st_dev, st.st_ino))
    if not keys:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # exited, or a zombie (its namespaces are already released)
            continue
        if (st.st_dev, st.st_ino) in keys:
            pids.append(int(entry))
    return pids


def _kill_all_in(namespaces: Sequence[str]) -> list[str]:
    """SIGKILLs everything running in the namespaces and waits until it is gone: `ip netns del`
    only unmounts the name, so a process left inside would keep the namespace, its veth and
    its sockets alive (chaos.md pitfall 11). Returns what it could not kill."""
    deadline = time.monotonic() + KILL_WAIT_S
    while pids := _pids_in(namespaces):
        if time.monotonic() > deadline:
            return [f"pids {pids} still run in {', '.join(namespaces)}"]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return []


# ---- what exists -------------------------------------------------------------------------------


def _namespaces() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _links() -> list[str]:
    return sorted(os.listdir(SYS_NET))


def _bridge_tables() -> list[str]:
    out = _run(["nft", "list", "tables"]).stdout
    return [m.group(1) for line in out.splitlines() if (m := TABLE_RE.match(line.strip()))]


def _destroy(prefix: str) -> tuple[list[str], list[str]]:
    """Removes every namespace, interface and nft table of one run, whatever its state file
    says. Returns (what was removed, what failed); never raises for things already gone."""
    assert PREFIX_RE.match(prefix), prefix
    namespaces = [ns for ns in _namespaces() if (m := NS_RE.match(ns)) and m.group(1) == prefix]
    links = [ln for ln in _links() if (m := LINK_RE.match(ln)) and m.group(1) == prefix]
    errors = _kill_all_in(namespaces)
    removed: list[str] = []
    # `link del group` removes the bridge and every veth pair in one kernel transaction (one
    # RCU wait instead of one per interface: 40 ms instead of 140 ms for 4 hosts). Deleting the
    # veths at all, rather than leaving them to the namespaces' destruction, means they are
    # gone when teardown returns instead of up to a second later (chaos.md §3). Links by name
    # follow, for any that missed the group (a run killed half way through setup).
    ports = [ln for ln in links if not ln.endswith("br")]
    bridges = [ln for ln in links if ln.endswith("br")]
    script = "".join(
        ([f"link del group {_link_group(prefix)}\n"] if links else [])
        + [f"link del {ln}\n" for ln in links]
        + [f"netns del {ns}\n" for ns in namespaces]
    )
    if script:
        p = _run(["ip", "-force", "-batch", "-"], stdin=script, check=False)
        bad = [ln for ln in p.stderr.splitlines() if ln.strip() and not _is_gone(ln)]
        bad = [ln for ln in bad if not ln.startswith("Command failed")]
        if p.returncode != 0 and bad:
            errors.append(f"`ip -batch` removing {prefix}: {' / '.join(bad)}")
    p = _run(["nft", "delete", "table", "bridge", prefix], check=False)
    if p.returncode == 0:
        removed.append(f"nft table bridge {prefix}")
    elif not _is_gone(p.stderr):
        errors.append(f"`nft delete table bridge {prefix}`: {p.stderr.strip()}")
    left_ns = set(namespaces) & set(_namespaces())
    left_links = set(links) & set(_links())
    errors += [f"namespace {ns} is still there" for ns in sorted(left_ns)]
    errors += [f"interface {ln} is still there" for ln in sorted(left_links)]
    removed += [f"namespace {ns}" for ns in namespaces if ns not in left_ns]
    removed += [f"bridge {ln}" for ln in bridges if ln not in left_links]
    removed += [f"veth {ln}" for ln in ports if ln not in left_links]
    return removed, errors


def _is_gone(stderr: str) -> bool:
    return any(g in stderr for g in _GONE)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Holds a Ctrl-C back until the block ends, so a second Ctrl-C cannot interrupt a
    teardown half way and leave namespaces behind. Delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # installed from C: cannot be restored from Python, so leave it
        yield
        return
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)


# ---- the network ------------------------------------------------------------------------------


def _normalise_subnet(subnet: str) -> str:
    """'10.99.3' or '10.99.3.0/24' -> '10.99.3'."""
    text = subnet if "/" in subnet or subnet.count(".") == 3 else f"{subnet}.0"
    try:
        net = ipaddress.ip_network(text if "/" in text else f"{text}/24")
    except ValueError as exc:
        raise ValueError(f"bad subnet {subnet!r}: {exc}") from None
    if net.version != 4 or net.prefixlen != 24:
        raise ValueError(f"the chaos subnet must be an IPv4 /24, not {subnet!r}")
    return str(net.network_address).rsplit(".", 1)[0]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on an interface or in a route of the root namespace."""
    out = _run(["ip", "-o", "-4", "addr", "show"]).stdout + _run(["ip", "-4", "route"]).stdout
    nets = []
    for m in re.finditer(r"(?:inet )?(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(m.group(1), strict=False))
    return [n for n in nets if n.prefixlen > 0]  # the default route overlaps everything


def _free_subnet() -> str:
    used = _used_networks()
    for _ in range(500):  # random, so two runs starting together rarely pick the same one
        octet2 = secrets.choice(SUBNET_SECOND_OCTETS)
        candidate = ipaddress.IPv4Network(f"10.{octet2}.{secrets.randbelow(256)}.0/24")
        if not any(candidate.overlaps(n) for n in used):
            return str(candidate.network_address).rsplit(".", 1)[0]
    raise NetError("no free /24 in 10.99.0.0 - 10.250.255.0 for the chaos bridge")


def _fresh_prefix(state_dir: Path) -> str:
    taken = {m.group(1) for ns in _namespaces() if (m := NS_RE.match(ns))}
    taken |= {m.group(1) for ln in _links() if (m := LINK_RE.match(ln))}
    for _ in range(1000):
        prefix = "rq" + secrets.token_hex(2)
        if prefix not in taken and not (state_dir / f"{prefix}.json").exists():
            return prefix
    raise NetError("no unused rq???? prefix left")


class Net:
    """Hosts on a private bridge, built by the constructor. Use as a context manager: teardown
    runs on leaving the block, on exceptions, on Ctrl-C and at interpreter exit (atexit), and
    is idempotent. Not thread-safe: one harness thread drives it."""

    def __init__(
        self, hosts: Sequence[str], *, subnet: str | None = None, state_dir: Path = STATE_DIR
    ) -> None:
        if isinstance(hosts, str) or not hosts:
            raise ValueError("hosts must be a non-empty sequence of names")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts are listed twice: {list(hosts)}")
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS} hosts on one bridge, not {len(hosts)}")
        why = require_root_tools()
        if why is not None:
            raise NetError(why)
        t0 = time.monotonic()
        self.hosts: tuple[str, ...] = tuple(hosts)
        self._index = {h: i for i, h in enumerate(self.hosts)}
        self.subnet = _normalise_subnet(subnet) if subnet is not None else _free_subnet()
        self.prefix = _fresh_prefix(state_dir)
        self.bridge = f"{self.prefix}br"
        self.table = self.prefix
        self.state_file = state_dir / f"{self.prefix}.json"
        self._faults = NetFaults.none()
        self._delayers: dict[str, subprocess.Popen[bytes]] = {}
        self.timings_ms: dict[str, float] = {}
        pid = os.getpid()
        # The bridge's alias names this very run (owner process and a nonce): cleanup() of
        # another state directory sees the owner lives, and a run that collides on the prefix
        # can tell the bridge is not its own.
        self._alias = (
            f"{ALIAS_TAG} owner={pid} start={_start_ticks(pid)} pidns={_pid_namespace()} "
            f"run={secrets.token_hex(4)}"
        )
        self._up = True
        atexit.register(self._teardown_at_exit)
        try:
            self._write_state()
            self._build()
            self.apply(NetFaults.none())
        except BaseException:
            # Ctrl-C or a failed command half way: remove what exists, keep the first error.
            # If another run took the same prefix a moment earlier (`link add` found its bridge),
            # everything named after the prefix is that run's: only our state file goes.
            if _alias(self.bridge) not in (None, self._alias):
                self._up = False
                self.state_file.unlink(missing_ok=True)
                atexit.unregister(self._teardown_at_exit)
                raise
            try:
                self.teardown()
            except NetError as exc:
                log.error("chaos.net_setup_undo_failed prefix=%s error=%s", self.prefix, exc)
            raise
        self.timings_ms["setup"] = (time.monotonic() - t0) * 1000
        log.info("chaos.net_up prefix=%s subnet=%s.0/24 hosts=%d setup_ms=%.0f", self.prefix,
                 self.subnet, len(self.hosts), self.timings_ms["setup"])  # fmt: skip

    def _write_state(self) -> None:
        # Written before anything exists, so a run killed during setup is still found.
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        state = {
            "owner_pid": pid,
            "owner_start": _start_ticks(pid),
            "owner_pidns": _pid_namespace(),
            "prefix": self.prefix,
            "hosts": list(self.hosts),
            "namespaces": [self.namespace(h) for h in self.hosts],
            "bridge": self.bridge,
            "table": self.table,
            "subnet": f"{self.subnet}.0/24",
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    def _build(self) -> None:
        # nf_call_* 0: br_netfilter is on in this kernel, so bridged frames would otherwise
        # also cross the root namespace's iptables FORWARD chain (pitfall 13). addrgenmode
        # none: no IPv6 link-local address, hence no IPv6 chatter, on our root-side links.
        # The alias names the owner, so cleanup() of another state directory knows it lives.
        lines = [
            f"link add {self.bridge} type bridge nf_call_iptables 0 nf_call_ip6tables 0 "
            "nf_call_arptables 0",
            f'link set {self.bridge} alias "{self._alias}"',
            f"link set {self.bridge} addrgenmode none group {_link_group(self.prefix)}",
            f"addr add {self.control_ip}/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for h in self.hosts:
            ns, port = self.namespace(h), self.port(h)
            lines += [
                f"netns add {ns}",
                f"link add {port} type veth peer name eth0 netns {ns}",
                f"link set {port} addrgenmode none",
                f"link set {port} group {_link_group(self.prefix)} master {self.bridge} up",
            ]
        _run(["ip", "-batch", "-"], stdin="\n".join(lines) + "\n")
        # IPv6 off in every namespace before eth0 comes up: the fault table lets every
        # non-IPv4 frame through (for ARP), so IPv6 traffic would escape every partition.
        no_ipv6 = ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                   "net.ipv6.conf.default.disable_ipv6=1"]  # fmt: skip
        _run_all([([*self.wrap(h), *no_ipv6], None) for h in self.hosts])
        _run_all(
            [
                (
                    ["ip", "-n", self.namespace(h), "-batch", "-"],
                    f"link set lo up\naddr add {self.ip(h)}/24 dev eth0\nlink set eth0 up\n",
                )
                for h in self.hosts
            ]
        )

    # ---- names --------------------------------------------------------------------------------

    def _i(self, host: str) -> int:
        try:
            return self._index[host]
        except KeyError:
            raise KeyError(
                f"{host!r} is not a host of this run ({', '.join(self.hosts)})"
            ) from None

    def ip(self, host: str) -> str:
        return f"{self.subnet}.{10 + self._i(host)}"

    @property
    def control_ip(self) -> str:
        """The bridge's own address, from the root namespace. The harness reaches every node
        through it whatever the faults: they act on forwarding between ports only."""
        return f"{self.subnet}.1"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{self._i(host)}"

    def port(self, host: str) -> str:
        """The host-side veth on the bridge (what the fault rules match)."""
        return f"{self.prefix}h{self._i(host)}"

    def wrap(self, host: str) -> list[str]:
        """argv prefix that runs a command in the host's namespace. `ip netns exec` execs the
        command, so a child started with it has the command's pid."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # ---- faults -------------------------------------------------------------------------------

    @property
    def faults(self) -> NetFaults:
        """The fault state in force (delays aside: see delayed())."""
        return self._faults

    def delayed(self) -> list[str]:
        return sorted(self._delayers)

    def apply(self, faults: NetFaults) -> None:
        """Replaces the whole fault state in one nft transaction: a flush and a rebuild of the
        table that no packet sees half done."""
        self._require_up()
        text = render_ruleset(self.table, faults, {h: self.port(h) for h in self.hosts})
        t0 = time.monotonic()
        _run(["nft", "-f", "-"], stdin=text)
        self.timings_ms["last_apply"] = (time.monotonic() - t0) * 1000
        self._faults = faults

    def heal(self) -> None:
        """No cut, no loss, no delay."""
        for host in list(self._delayers):
            self.clear_delay(host)
        self.apply(NetFaults.none())

    def delay(self, host: str, ms: float, jitter_ms: float = 0) -> None:
        """Holds every packet the host sends for ms +- jitter_ms, so its round trips grow by
        ms. This kernel has no netem and no nft `queue` (pitfall 1): an iptables NFQUEUE rule
        in the host's namespace feeds a delayer process (chaos/nfq_delay.py) running there.
        --queue-bypass: if the delayer dies, packets pass undelayed instead of being dropped.
        Replaces an earlier delay of the same host. Takes 70-240 ms (a Python start)."""
        self._require_up()
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay and jitter must not be negative ({ms}, {jitter_ms})")
        if host in self._delayers:
            self.clear_delay(host)
        ns = self.namespace(host)
        argv = [*self.wrap(host), sys.executable, "-m", "raftmq.chaos.nfq_delay", "--queue",
                str(DELAY_QUEUE), "--delay-ms", str(ms), "--jitter-ms", str(jitter_ms)]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            env=child_env(),  # `-m raftmq.chaos...` from a checkout as from an install
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C of the harness does not reach it first
        )
        self._delayers[host] = proc
        try:
            self._await_ready(proc, ns)
            _run([*self.wrap(host), "iptables", "-w", "5", "-A", "OUTPUT", "-o", "eth0", "-j",
                  "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"])  # fmt: skip
        except BaseException:
            self._stop_delayer(host)
            raise

    @staticmethod
    def _await_ready(proc: subprocess.Popen[bytes], ns: str) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        ready, _, _ = select.select([proc.stdout], [], [], DELAYER_START_TIMEOUT_S)
        line = proc.stdout.readline().decode(errors="replace") if ready else ""
        if line.startswith("nfq_delay.ready"):
            return
        proc.kill()
        _, err = proc.communicate(timeout=DELAYER_STOP_TIMEOUT_S)
        why = err.decode(errors="replace").strip() or line.strip() or "no answer"
        raise NetError(f"the delayer in {ns} did not start in {DELAYER_START_TIMEOUT_S:g} s: {why}",
                       proc.args if isinstance(proc.args, list) else [], why)  # fmt: skip

    def clear_delay(self, host: str) -> None:
        """Removes the host's delay: the queue rule first, so no new packet waits, then the
        delayer, which releases what it holds on SIGTERM."""
        self._require_up()
        if host not in self._delayers:
            self._i(host)  # a typo is an error, a host without delay is not
            return
        try:
            _run([*self.wrap(host), "iptables", "-w", "5", "-D", "OUTPUT", "-o", "eth0", "-j",
                  "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"])  # fmt: skip
        finally:
            self._stop_delayer(host)

    def _stop_delayer(self, host: str) -> None:
        proc = self._delayers.pop(host, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=DELAYER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()

    def cut_connections(self, host: str, peer_host: str | None = None) -> None:
        """Aborts the host's TCP connections (to one peer, or all; listeners stay) now: its
        application gets ECONNABORTED, the peer learns only when it next sends (pitfall 3)."""
        self._require_up()
        argv = [*self.wrap(host), "ss", "-K", "-t"]
        if peer_host is not None:
            argv += ["dst", self.ip(peer_host)]
        _run(argv)

    # ---- lifecycle ----------------------------------------------------------------------------

    def _require_up(self) -> None:
        if not self._up:
            raise RuntimeError(f"chaos network {self.prefix} is torn down")

    def teardown(self) -> None:
        """Kills every process in the namespaces, deletes them, the veths, the bridge, the nft
        table and the state file. Idempotent; a Ctrl-C waits until it is done. Raises NetError
        naming what could not be removed (after trying everything)."""
        if not self._up:
            return
        with _sigint_deferred():
            t0 = time.monotonic()
            self._up = False
            for host in list(self._delayers):
                self._stop_delayer(host)  # their namespace is about to go: no rule to remove
            removed, errors = _destroy(self.prefix)
            self.state_file.unlink(missing_ok=True)
            atexit.unregister(self._teardown_at_exit)
            self.timings_ms["teardown"] = (time.monotonic() - t0) * 1000
        log.info("chaos.net_down prefix=%s removed=%d teardown_ms=%.0f", self.prefix,
                 len(removed), self.timings_ms["teardown"])  # fmt: skip
        if errors:
            raise NetError(f"teardown of {self.prefix} left: {'; '.join(errors)}")

    def _teardown_at_exit(self) -> None:
        try:
            self.teardown()
        except NetError as exc:
            log.error("chaos.net_teardown_failed prefix=%s error=%s", self.prefix, exc)

    def __enter__(self) -> Net:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if e is None:
            self.teardown()
            return
        try:
            self.teardown()
        except NetError as exc:  # the block's own exception is the one to see
            log.error("chaos.net_teardown_failed prefix=%s error=%s", self.prefix, exc)


# ---- crashed runs -------------------------------------------------------------------------------


def _state_owner(path: Path) -> tuple[int, int, int] | None:
    try:
        st = json.loads(path.read_text())
        return int(st["owner_pid"]), int(st["owner_start"]), int(st["owner_pidns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable or from an older layout: nobody can be shown to own it


def _alias(bridge: str) -> str | None:
    try:
        return (SYS_NET / bridge / "ifalias").read_text().strip()
    except OSError:
        return None


def _alias_owner(bridge: str) -> tuple[int, int, int] | None:
    m = ALIAS_RE.match(_alias(bridge) or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def cleanup(state_dir: Path = STATE_DIR, force: bool = False, only: str | None = None) -> list[str]:
    """Removes what crashed runs left: the runs of state_dir whose owner process is dead (every
    run with force), and any rq????-named namespace, bridge, veth or bridge-family nft table
    that no live run owns. A run is live when its owner (pid and start time, so a recycled pid
    does not count) runs, as recorded in its state file here or in STATE_DIR, or in its
    bridge's alias (runs of other state directories); an owner in another pid namespace cannot
    be seen, so its run is kept unless force. `only` limits all this to the one run of that
    prefix. Returns what it removed."""
    why = require_root_tools()
    if why is not None:
        raise NetError(why)
    live: set[str] = set()
    if not force:
        for d in {state_dir, STATE_DIR}:
            for f in d.glob("rq????.json") if d.is_dir() else []:
                owner = _state_owner(f)
                if owner is not None and _owner_alive(*owner):
                    live.add(f.stem)
        for ln in _links():
            if (m := LINK_RE.match(ln)) and ln.endswith("br"):
                owner = _alias_owner(ln)
                if owner is not None and _owner_alive(*owner):
                    live.add(m.group(1))
    removed: list[str] = []
    errors: list[str] = []
    files = sorted(state_dir.glob("rq????.json")) if state_dir.is_dir() else []
    dead = {f.stem for f in files if PREFIX_RE.match(f.stem)} - live
    dead |= {m.group(1) for ns in _namespaces() if (m := NS_RE.match(ns))} - live
    dead |= {m.group(1) for ln in _links() if (m := LINK_RE.match(ln))} - live
    dead |= set(_bridge_tables()) - live
    if only is not None:
        dead &= {only}
    for prefix in sorted(dead):
        gone, failed = _destroy(prefix)
        removed += gone
        errors += failed
        state = state_dir / f"{prefix}.json"
        if state.exists():
            state.unlink()
            removed.append(f"state file {state}")
    if removed:
        log.info("chaos.cleanup removed=%d force=%s", len(removed), force)
    if errors:
        raise NetError(f"cleanup could not remove: {'; '.join(errors)}")
    return removed
