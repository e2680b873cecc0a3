"""Opening a journal directory: trust durable sealed segments, rescan the tail, cut a torn tail.

A segment whose .idx is in place was fsynced (sync() renames the .idx into place only after the
segment's data), so it is trusted and only spot-checked. The trailing segments without an .idx
(sealed since the last sync, and the active one) may have lost bytes in a crash: they are scanned
record by record and the log ends at the first bad record. A gap, a misnamed file or a bad record
inside the trusted part raises CorruptJournalError: recovery never cuts what was durable.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal.format import (
    CRC_BYTES,
    HEADER_BYTES,
    CrcFunction,
    body_crc,
    unpack_header,
)
from raftmq.raftlog.journal.segments import (
    IDX_RE,
    PENDING_RE,
    POS,
    POS_BYTES,
    SEG_RE,
    Segment,
    create_segment,
    index_name,
    segment_name,
    unlink_index_files,
    unlink_segment_files,
)
from raftmq.raftlog.journal.term_runs import (
    TERMS_FILE,
    Run,
    decode_runs,
    encode_runs,
    load_terms_bytes,
    runs_from,
    write_terms,
)
from raftmq.raftlog.meta import write_file_atomically

log = logging.getLogger("raftlog.journal")

_SCAN_CHUNK_BYTES = 1 << 20  # recovery reads segments in chunks of this size


@dataclass(slots=True)
class Scan:
    """What a sequential scan of one segment found."""

    positions: array[int] = field(default_factory=lambda: array("Q"))
    runs: list[Run] = field(default_factory=list)  # (first index, term)
    last_term: int = 0
    end: int = 0  # byte offset just past the last good record
    problem: str | None = None  # why the scan stopped before the end of the file

    @property
    def count(self) -> int:
        return len(self.positions)


@dataclass(slots=True)
class Recovered:
    """The journal as found: its segments (the last one active, with its fd open for writing),
    the active segment's record positions, and the term runs from the first index on."""

    segments: list[Segment]
    positions: array[int]
    runs: list[Run]


def recover(directory: Path, dir_fd: int, max_record_bytes: int) -> Recovered:
    """Open the journal in directory (creating an empty one if it holds no segment)."""
    return _Recovery(directory, dir_fd, max_record_bytes).run()


class _Recovery:
    def __init__(self, directory: Path, dir_fd: int, max_record_bytes: int) -> None:
        self._dir = directory
        self._dir_fd = dir_fd
        self._max_record_bytes = max_record_bytes

    def run(self) -> Recovered:
        firsts, idx_firsts, sizes = self._list_files()
        if not firsts:
            return self._fresh()
        segments = [Segment(f, self._dir / segment_name(f), size=sizes[f]) for f in firsts]
        trusted, tail = self._split_trusted(segments, idx_firsts)
        first_terms = self._check_names(trusted, tail)
        last_terms = self._verify_trusted(trusted, [s.first for s in segments[1:]], idx_firsts)
        prev_term = last_terms[trusted[-1].first] if trusted else 0
        kept_tail, scans = self._rescan_tail(tail, prev_term)
        kept = trusted + kept_tail
        # A segment left without records goes, unless it is the only one (it names the next index).
        if len(kept) > 1 and kept[-1].count == 0:
            unlink_segment_files(self._dir, kept.pop())
        positions = self._commit_indexes(kept, scans)
        runs = self._assemble_runs(kept, scans, first_terms, last_terms)
        runs = self._finish(kept, runs)
        return Recovered(kept, positions, runs)

    # ---- steps ---------------------------------------------------------------------------------

    def _fresh(self) -> Recovered:
        fresh = create_segment(self._dir, 1)
        try:
            os.fsync(self._dir_fd)
            write_terms(self._dir, [], [])
        except BaseException:
            os.close(fresh.fd)
            raise
        return Recovered([fresh], array("Q"), [])

    @staticmethod
    def _split_trusted(
        segments: list[Segment], idx_firsts: set[int]
    ) -> tuple[list[Segment], list[Segment]]:
        """Trusted: the sealed segments before the first one without an .idx. The last segment is
        always in the tail (it is the active one, whose positions live in memory)."""
        scan_from = len(segments) - 1
        while scan_from > 0 and segments[scan_from - 1].first not in idx_firsts:
            scan_from -= 1
        return segments[:scan_from], segments[scan_from:]

    def _check_names(self, trusted: list[Segment], tail: list[Segment]) -> dict[int, int]:
        """Every segment's first record carries the index in its name. Done first, so that a
        misnamed file is reported as such rather than as a gap. Returns the trusted segments'
        first terms by first index."""
        first_terms: dict[int, int] = {}
        for seg in trusted:
            with self._opened(seg):
                raw = os.pread(seg.fd, HEADER_BYTES, 0)
            if len(raw) < HEADER_BYTES:
                raise CorruptJournalError(str(seg.path), 0, "segment shorter than one header")
            _, _, found, term, _ = unpack_header(raw, 0)
            if found != seg.first:
                raise CorruptJournalError(
                    str(seg.path), 0, f"segment named {seg.first} starts with record {found}"
                )
            first_terms[seg.first] = term
        for seg in tail:  # the first record may be torn here: only a whole one can misname a file
            with self._opened(seg):
                self._scan(seg, min_term=0, max_count=1)
        return first_terms

    def _verify_trusted(
        self, trusted: list[Segment], next_firsts: list[int], idx_firsts: set[int]
    ) -> dict[int, int]:
        """Spot-check each trusted segment (rescan it and rewrite its .idx if that fails; a bad
        record there raises). Returns each one's last term by first index."""
        last_terms: dict[int, int] = {}
        for seg, next_first in zip(trusted, next_firsts, strict=False):
            seg.count = next_first - seg.first
            with self._opened(seg):
                term = self._spot_check(seg) if seg.first in idx_firsts else None
                if term is None:
                    scan = self._scan(seg, min_term=0, max_count=seg.count)
                    if scan.problem is None and scan.count != seg.count:
                        scan.problem = (
                            f"holds {scan.count} records but the next segment starts at "
                            f"{next_first}: a gap"
                        )
                    if scan.problem is not None:
                        raise CorruptJournalError(str(seg.path), scan.end, scan.problem)
                    self._commit_index(seg, scan.positions, rebuilt=True)
                    term = scan.last_term
            seg.committed = True
            last_terms[seg.first] = term
        return last_terms

    def _rescan_tail(
        self, tail: list[Segment], prev_term: int
    ) -> tuple[list[Segment], dict[Segment, Scan]]:
        """Scan the untrusted segments record by record; the log ends at the first bad record or
        at the first segment that falls short of the next one's first index (later ones go)."""
        scans: dict[Segment, Scan] = {}
        kept: list[Segment] = []
        for j, seg in enumerate(tail):
            limit = tail[j + 1].first - seg.first if j + 1 < len(tail) else None
            with self._opened(seg, writable=True):
                scan = self._scan(seg, min_term=prev_term, max_count=limit)
                seg.count = scan.count
                short = limit is not None and scan.count < limit
                dropped = tail[j + 1 :] if short else []
                if scan.problem is not None or dropped:
                    for later in reversed(dropped):  # newest first: each step leaves a prefix
                        unlink_segment_files(self._dir, later)
                    self._cut_torn(seg, scan, [s.path.name for s in dropped])
            scans[seg] = scan
            kept.append(seg)
            prev_term = scan.last_term
            if short:
                break
        return kept, scans

    def _commit_indexes(self, kept: list[Segment], scans: dict[Segment, Scan]) -> array[int]:
        """Sealed segments that were rescanned (sealed before the crash but never synced) get
        their .idx and are durable from now on; the active segment's positions move to memory.
        Returns those positions."""
        active = kept[-1]
        for seg in kept[:-1]:
            if seg in scans:
                with self._opened(seg):
                    self._commit_index(seg, scans[seg].positions, rebuilt=False)
                seg.committed = True
        positions = scans[active].positions if active in scans else self._load_index(active)
        active.committed = False
        unlink_index_files(self._dir, active.first)
        return positions

    def _assemble_runs(
        self,
        kept: list[Segment],
        scans: dict[Segment, Scan],
        first_terms: dict[int, int],
        last_terms: dict[int, int],
    ) -> list[Run]:
        """The trusted part's runs (from the terms file if it agrees), then the scanned ones."""
        scanned = [s for s in kept if s in scans]
        trusted_end = scanned[0].first if scanned else kept[-1].first + kept[-1].count
        runs = self._trusted_runs(
            [s for s in kept if s not in scans], trusted_end, first_terms, last_terms
        )
        for seg in scanned:
            for start, term in scans[seg].runs:
                if not runs or runs[-1][1] != term:
                    runs.append((start, term))
        return runs

    def _finish(self, kept: list[Segment], runs: list[Run]) -> list[Run]:
        """Open the active segment for appends, make the cuts durable, store the runs."""
        active = kept[-1]
        active.fd = os.open(active.path, os.O_RDWR)
        try:
            os.fdatasync(active.fd)
            os.fsync(self._dir_fd)
            runs = runs_from(self._with_base(runs, kept[0].first), kept[0].first - 1)
            encoded = encode_runs([s for s, _ in runs], [t for _, t in runs])
            if load_terms_bytes(self._dir) != encoded:
                write_file_atomically(self._dir / TERMS_FILE, encoded)
        except BaseException:
            os.close(active.fd)
            active.fd = -1
            raise
        return runs

    def _with_base(self, runs: list[Run], first: int) -> list[Run]:
        """The runs plus the stored run covering first - 1 (the base a retention cut or a
        snapshot install left: its term is the next append's prevLogTerm), when the segments
        alone do not name it (all of them rescanned, or none holds a record)."""
        if first <= 1 or (runs and runs[0][0] <= first - 1):
            return runs
        data = load_terms_bytes(self._dir)
        stored = decode_runs(data) if data is not None else None
        below = [r for r in stored or [] if r[0] <= first - 1]
        if not below:
            return runs
        base = below[-1]
        if not runs:
            return [base]
        if base[1] == runs[0][1]:
            return [(base[0], base[1]), *runs[1:]]
        return [base, *runs] if base[1] < runs[0][1] else runs

    # ---- helpers -------------------------------------------------------------------------------

    def _list_files(self) -> tuple[list[int], set[int], dict[int, int]]:
        """Segment first indexes (sorted, non-empty files only), which have an .idx, and sizes.
        Removes what carries no records: pending indexes, orphan indexes, empty segments."""
        seg_firsts: list[int] = []
        idx_firsts: set[int] = set()
        leftovers: list[Path] = []
        for name in os.listdir(self._dir):
            if m := SEG_RE.match(name):
                seg_firsts.append(int(m.group(1)))
            elif m := IDX_RE.match(name):
                idx_firsts.add(int(m.group(1)))
            elif PENDING_RE.match(name) or name == TERMS_FILE + ".tmp":
                leftovers.append(self._dir / name)
            elif name != TERMS_FILE:
                log.warning("journal.unknown_file path=%s", self._dir / name)
        seg_firsts.sort()
        for first in seg_firsts:
            if first < 1:
                raise CorruptJournalError(
                    str(self._dir / segment_name(first)), 0, "a segment named index 0"
                )
        leftovers += [self._dir / index_name(f) for f in idx_firsts - set(seg_firsts)]
        sizes = {f: (self._dir / segment_name(f)).stat().st_size for f in seg_firsts}
        # Empty files are segments that never got a record (or lost all of them); the newest is
        # kept when nothing else is left, because its name is the next index to append.
        firsts = [f for f in seg_firsts if sizes[f] > 0]
        empties = [f for f in seg_firsts if sizes[f] == 0]
        if not firsts and empties:
            firsts = [empties.pop()]
        for f in empties:
            leftovers += [self._dir / segment_name(f), self._dir / index_name(f)]
            idx_firsts.discard(f)
        for path in leftovers:
            path.unlink(missing_ok=True)
        if leftovers:
            os.fsync(self._dir_fd)
        return firsts, idx_firsts, sizes

    @contextlib.contextmanager
    def _opened(self, seg: Segment, *, writable: bool = False) -> Iterator[Segment]:
        """Recovery opens one segment at a time, so a journal of many segments needs few fds."""
        seg.fd = os.open(seg.path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            yield seg
        finally:
            os.close(seg.fd)
            seg.fd = -1

    def _cut_torn(self, seg: Segment, scan: Scan, dropped_files: list[str]) -> None:
        log.warning(
            "journal.torn_tail path=%s offset=%d dropped_from=%d bytes_dropped=%d reason=%r "
            "dropped_files=%s",
            seg.path,
            scan.end,
            seg.first + scan.count,
            seg.size - scan.end,
            scan.problem or "records missing before the next segment",
            dropped_files,
        )
        os.ftruncate(seg.fd, scan.end)
        os.fdatasync(seg.fd)
        seg.size = scan.end

    def _spot_check(self, seg: Segment) -> int | None:
        """Cheap checks of a sealed segment with an .idx: the .idx length, its first and last
        positions, the last record's header and the file size. Returns the last record's term,
        or None if the .idx must be rebuilt."""
        idx_path = self._dir / index_name(seg.first)
        if idx_path.stat().st_size != seg.count * POS_BYTES:
            return None
        ifd = os.open(idx_path, os.O_RDONLY)
        try:
            first_pos = os.pread(ifd, POS_BYTES, 0)
            last_pos = os.pread(ifd, POS_BYTES, (seg.count - 1) * POS_BYTES)
        finally:
            os.close(ifd)
        if len(first_pos) != POS_BYTES or len(last_pos) != POS_BYTES:
            return None
        if POS.unpack(first_pos)[0] != 0:
            return None
        pos = int(POS.unpack(last_pos)[0])
        raw = os.pread(seg.fd, HEADER_BYTES, pos)
        if len(raw) != HEADER_BYTES:
            return None
        _, n, index, term, _ = unpack_header(raw, 0)
        if index != seg.first + seg.count - 1 or pos + HEADER_BYTES + n != seg.size:
            return None
        return int(term)

    def _commit_index(self, seg: Segment, positions: array[int], *, rebuilt: bool) -> None:
        """Write seg's .idx in place; seg.fd must be open."""
        if rebuilt:
            log.warning("journal.index_rebuilt path=%s records=%d", seg.path, len(positions))
        os.fdatasync(seg.fd)  # an .idx in place asserts that the segment's bytes are durable
        write_file_atomically(self._dir / index_name(seg.first), positions.tobytes())

    def _load_index(self, seg: Segment) -> array[int]:
        path = self._dir / index_name(seg.first)
        with open(path, "rb") as f:
            raw = f.read(seg.count * POS_BYTES)
        if len(raw) != seg.count * POS_BYTES:
            raise CorruptJournalError(str(path), len(raw), "position index too short")
        positions = array("Q")
        positions.frombytes(raw)
        return positions

    def _trusted_runs(
        self,
        trusted: list[Segment],
        trusted_end: int,
        first_terms: dict[int, int],
        last_terms: dict[int, int],
    ) -> list[Run]:
        """Term runs below trusted_end: from the terms file if it agrees with every trusted
        segment's first and last record, else rebuilt by scanning those segments.

        Why a file and not a scan: a header read per record of every sealed segment would make
        opening a 10 GB journal take minutes. The file is tiny and is fsynced before the first
        record of a new run is written, so it names every run that can be on disk; runs it names
        beyond trusted_end (a crash before a truncation was recorded) are ignored, and the tail is
        rescanned anyway.
        """
        if not trusted:
            return []
        data = load_terms_bytes(self._dir)
        stored = decode_runs(data) if data is not None else None
        if stored is not None:
            runs = [r for r in stored if r[0] < trusted_end]
            starts = [s for s, _ in runs]

            def term_of(index: int) -> int | None:
                k = bisect.bisect_right(starts, index) - 1
                return runs[k][1] if k >= 0 else None

            if all(
                term_of(seg.first) == first_terms[seg.first]
                and term_of(seg.first + seg.count - 1) == last_terms[seg.first]
                for seg in trusted
            ):
                return runs
        log.warning("journal.terms_rebuilt dir=%s reason=terms file missing or stale", self._dir)
        runs = []
        for seg in trusted:
            with self._opened(seg):
                scan = self._scan(seg, min_term=runs[-1][1] if runs else 0, max_count=seg.count)
            if scan.problem is not None:
                raise CorruptJournalError(str(seg.path), scan.end, scan.problem)
            for start, term in scan.runs:
                if not runs or runs[-1][1] != term:
                    runs.append((start, term))
        return runs

    def _scan(self, seg: Segment, *, min_term: int, max_count: int | None) -> Scan:
        """Read seg sequentially, checking every record, until the first bad one or max_count.

        A good first record whose index disagrees with the file name is not a torn write but a
        misplaced file: that raises instead of being cut.
        """
        out = Scan(last_term=min_term)
        fd, size = seg.fd, seg.size
        buf = b""
        buf_at = 0  # file offset of buf[0]
        off = 0
        expected = seg.first
        while off < size:
            if max_count is not None and out.count >= max_count:
                out.problem = f"bytes after record {expected - 1}, the segment's last"
                break
            if size - off < HEADER_BYTES:
                out.problem = "incomplete header"
                break
            if off + HEADER_BYTES > buf_at + len(buf):
                buf = os.pread(fd, _SCAN_CHUNK_BYTES, off)
                buf_at = off
            crc, n, index, term, crc_of = unpack_header(buf, off - buf_at)
            if n > self._max_record_bytes:
                if off + HEADER_BYTES + n <= size and self._crc_matches(fd, off, n, crc, crc_of):
                    # A whole, valid record: the limit was lowered, this is no torn write.
                    raise CorruptJournalError(
                        str(seg.path),
                        off,
                        f"record {index} holds {n} bytes, above max_record_bytes="
                        f"{self._max_record_bytes}; open with the limit it was written with",
                    )
                out.problem = f"length field {n} exceeds max_record_bytes"
                break
            rec_end = off + HEADER_BYTES + n
            if rec_end > size:
                out.problem = "record extends past the end of the file"
                break
            if rec_end > buf_at + len(buf):
                buf = os.pread(fd, max(_SCAN_CHUNK_BYTES, rec_end - off), off)
                buf_at = off
            start = off - buf_at
            if body_crc(buf, start, start + HEADER_BYTES + n, crc_of) != crc:
                out.problem = "crc mismatch"
                break
            if index != expected:
                if off == 0:
                    raise CorruptJournalError(
                        str(seg.path), 0, f"segment named {seg.first} starts with record {index}"
                    )
                out.problem = f"record holds index {index}, expected {expected}"
                break
            if term < out.last_term:
                raise CorruptJournalError(
                    str(seg.path), off, f"term {term} after term {out.last_term}: terms decrease"
                )
            if not out.runs or out.runs[-1][1] != term:
                out.runs.append((index, term))
            out.last_term = term
            out.positions.append(off)
            off = rec_end
            expected += 1
        out.end = off
        return out

    @staticmethod
    def _crc_matches(fd: int, off: int, n: int, crc: int, crc_of: CrcFunction) -> bool:
        """Check a record's crc in bounded chunks, for a length too large to read in one go."""
        value = crc_of(os.pread(fd, HEADER_BYTES - CRC_BYTES, off + CRC_BYTES))
        pos, end = off + HEADER_BYTES, off + HEADER_BYTES + n
        while pos < end:
            chunk = os.pread(fd, min(_SCAN_CHUNK_BYTES, end - pos), pos)
            if not chunk:
                return False
            value = crc_of(chunk, value)
            pos += len(chunk)
        return value == crc
