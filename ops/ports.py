"""Which ports a cluster needs are taken, and by whom: a test bind on each (host, port), then the
listening socket's inode in /proc/net/tcp{,6} matched against /proc/<pid>/fd of the processes this
user can see. `cluster up` asks before it starts anything.

Reads /proc and binds (then closes) test sockets; it never signals anything.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"  # st column of /proc/net/tcp


@dataclass(frozen=True, slots=True)
class BusyPort:
    process: str  # the cluster process that needs it
    host: str
    port: int


def in_use(host: str, port: int) -> bool:
    """True if a listener holds (host, port). SO_REUSEADDR, as the servers bind: a socket of an
    earlier run left in TIME_WAIT does not count. A host not on this machine cannot be checked
    (e.g. a network namespace's address) and counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def busy_ports(needed: Iterable[tuple[str, str, int]]) -> list[BusyPort]:
    """The (process, host, port) of `needed` that some listener holds now, in order."""
    return [BusyPort(name, host, port) for name, host, port in needed if in_use(host, port)]


def listen_inodes(proc_net_tcp: str, port: int) -> set[int]:
    """The inodes of listening sockets on `port` in the text of /proc/net/tcp or tcp6."""
    out = set()
    for line in proc_net_tcp.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != TCP_LISTEN:
            continue
        local_port = int(cols[1].rsplit(":", 1)[1], 16)
        if local_port == port and cols[9] != "0":
            out.add(int(cols[9]))
    return out


def listener_pids(port: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids (visible to this user) that hold a listening socket on `port`."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            inodes |= listen_inodes((proc / "net" / name).read_text(), port)
        except OSError:
            continue
    if not inodes:
        return []
    targets = {f"socket:[{i}]" for i in inodes}
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # another user's, or gone
        for fd in fds:
            try:
                if str(fd.readlink()) in targets:
                    pids.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(pids)


def command_line(pid: int, max_chars: int = 120) -> str:
    """The process's argv as one line (shortened), or "" if it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
