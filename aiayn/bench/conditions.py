"""Where and how quietly a bench ran: the machine header every speed table carries, and each round's load.

The header names what a figure depends on: the CPU model and its cores, the instruction sets that change
int8's and CTranslate2's speed (AVX-512 VNNI, AMX; from /proc/cpuinfo's flags), the commit of the checkout
and the command. CTranslate2's ratios differ by up to 40 % between the AMD EPYC and the Intel Xeon this
project measured on, so a table without its machine cannot be compared with another.

Each round records the 1-minute load average and the bench's own share of the CPU time the machine spent in
it (its processes' CPU times, children included, against /proc/stat's busy time). A run taken at a load above
the cores it uses, while it had less than ``SHARE_FLOOR`` of the machine's CPU time, or whose ratios spread
more than ``SPREAD_LIMIT`` around their median, ends with one warning line, as hyperfine's "Statistical
outliers were detected. Consider re-running this benchmark on a quiet system": its figures are the machine's
moment as much as the code's. The load average lags by a minute; the share tells at once.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPREAD_LIMIT = 0.15  # ±15 % around a ratio's median, over its rounds
SHARE_FLOOR = 0.8  # the bench's share of the machine's busy CPU time below which others ran beside it
# The flags of /proc/cpuinfo that change what an engine can do, by the name a reader knows them by.
FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_int8": "AMX-INT8",
    "amx_bf16": "AMX-BF16",
}
CHECKOUT = Path(__file__).resolve().parents[2]


def cpu_info(cpuinfo: str) -> tuple[str, list[str]]:
    """The CPU's model name and its instruction sets of ``FLAGS``, from /proc/cpuinfo's text."""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [name for flag, name in FLAGS.items() if flag in flags]


def commit_of(checkout: Path = CHECKOUT) -> str | None:
    """The checkout's commit (``+ changes`` where its tracked files differ from it); None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")


def machine_header(argv: list[str] | None = None) -> dict[str, Any]:
    """The machine, the commit and the command of a bench run (the command: this process's, as `aiayn ...`)."""
    try:
        model, flags = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        model, flags = "", []
    words = sys.argv[1:] if argv is None else argv
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "instruction_sets": flags,
        "commit": commit_of(),
        "command": shlex.join(["aiayn", *words]),
    }


def format_header(header: dict[str, Any]) -> str:
    sets = ", ".join(header["instruction_sets"]) or "none of AVX2, AVX-512, VNNI, AMX"
    commit = header["commit"] or "not a git checkout"
    return f"Machine: {header['cpu']}, {header['cores']} cores ({sets}); commit {commit}; `{header['command']}`"


def machine_busy_s() -> float | None:
    """The CPU time all cores spent busy since boot (/proc/stat: user, nice, system, irq, softirq, steal), in s."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s(root: int | None = None) -> float | None:
    """The CPU time of this process and every process below it (its workers), with their waited-for children's."""
    root = os.getpid() if root is None else root
    times: dict[int, tuple[int, float]] = {}  # pid → (parent, CPU s)
    tick = os.sysconf("SC_CLK_TCK")
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        rest = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": state, ppid, ... utime is field 14
        times[pid] = (int(rest[1]), sum(int(v) for v in rest[11:15]) / tick)
    if root not in times:
        return None
    below, total, frontier = {root}, 0.0, [root]
    while frontier:
        parent = frontier.pop()
        total += times[parent][1]
        children = [pid for pid, (ppid, _) in times.items() if ppid == parent and pid not in below]
        below.update(children)
        frontier.extend(children)
    return total


@dataclass(frozen=True)
class Round:
    load: float  # the 1-minute load average as the round ended
    share: float | None  # the bench's CPU time over the round / the machine's busy CPU time then (None: unknown)


@dataclass
class Watch:
    """``watch.round_done()`` after each round: its load and the bench's share of the CPU time spent in it."""

    cores: int  # the cores the bench uses: a load above them is other work
    read_load: Callable[[], float] = field(default=lambda: os.getloadavg()[0])
    read_machine: Callable[[], float | None] = machine_busy_s
    read_own: Callable[[], float | None] = own_cpu_s
    rounds: list[Round] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.machine, self.own = self.read_machine(), self.read_own()

    def round_done(self) -> None:
        machine, own = self.read_machine(), self.read_own()
        share = None
        if None not in (machine, own, self.machine, self.own) and machine > self.machine:  # type: ignore[operator]
            share = min(1.0, (own - self.own) / (machine - self.machine))  # type: ignore[operator]
        self.rounds.append(Round(self.read_load(), share))
        self.machine, self.own = machine, own


def spread(ratios: Iterable[tuple[float, float, float]]) -> float:
    """The widest a ratio's rounds strayed from its median, as a fraction of it, over (median, low, high)s."""
    return max((max(high / median - 1, 1 - low / median) for median, low, high in ratios if median > 0), default=0.0)


@dataclass(frozen=True)
class Quiet:
    """How alone a run was: its rounds' loads and shares, and its ratios' spread."""

    cores: int
    rounds: list[Round]
    spread: float

    @property
    def warning(self) -> str | None:
        """One line where the run was not alone or its rounds disagree; None where it was quiet."""
        loads = [r.load for r in self.rounds]
        shares = [r.share for r in self.rounds if r.share is not None]
        reasons = []
        if loads and max(loads) > self.cores:
            reasons.append(f"a load average up to {max(loads):.1f} on the {self.cores} cores it uses")
        if shares and min(shares) < SHARE_FLOOR:
            reasons.append(f"as little as {min(shares):.0%} of the machine's CPU time its own")
        if self.spread > SPREAD_LIMIT:
            reasons.append(f"ratios spread ±{self.spread:.0%} around their median (more than ±{SPREAD_LIMIT:.0%})")
        if not reasons:
            return None
        because = "; ".join(reasons)
        return f"Warning: this run was not alone ({because}). Consider re-running this benchmark on a quiet system."

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "rounds": [asdict(r) for r in self.rounds],
            "max_load": max((r.load for r in self.rounds), default=None),
            "min_share": min((r.share for r in self.rounds if r.share is not None), default=None),
            "spread": self.spread,
            "warning": self.warning,
        }


def ends_with_warning(text: str, warning: str | None) -> str:
    """The report, ending with the warning line (``Quiet.warning``) where the run was not alone."""
    return text if warning is None else f"{text}\n\n{warning}"

