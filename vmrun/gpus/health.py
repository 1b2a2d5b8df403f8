"""Is a GPU fit to train on: what `nvidia-smi -q` and the kernel log say, read into
problems a person acts on (reset it, replace it, look at the cooling, reseat the card).

Both are text formats that drivers change: `nvidia-smi -q` renamed "Clocks Throttle
Reasons" to "Clocks Event Reasons" (535), split ECC counts by generation (Volta's Single/
Double Bit, Ampere's SRAM/DRAM Correctable/Uncorrectable, 535.161's SRAM Parity and
SEC-DED), and prints "Remapped Rows : N/A" on one line before Ampere. The parser reads the
indented key/value tree and looks keys up by the names every version uses, so a section
it does not know is left alone rather than misread. Xid lines come with any of dmesg's
time formats, with or without `pid=`; what each Xid means and how bad it is follows
NVIDIA's Xid catalog.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vmrun.ssh.connection import Connection

ERROR, WARN, INFO = "error", "warn", "info"  # error: do not train on it until it is fixed

Tree = dict[str, Any]  # a section: key -> value text, or key -> its own section


@dataclass(frozen=True)
class Problem:
    level: str  # ERROR, WARN or INFO
    what: str  # ecc, retired-pages, remapped-rows, clocks, pcie, persistence, xid
    text: str


@dataclass(frozen=True)
class GpuHealth:
    """One GPU as `nvidia-smi -q` describes it; None where the GPU or driver says N/A."""

    bus: str  # 0000:19:00 (domain:bus:device), as Xid lines name it
    name: str
    persistence: bool | None = None
    uncorrectable_volatile: int | None = None  # ECC, since the driver loaded
    uncorrectable_aggregate: int | None = None  # ECC, the GPU's lifetime
    correctable_volatile: int | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    clocks_held: tuple[str, ...] = ()  # active reasons that slow a busy GPU
    power_capped: bool = False
    pcie_gen: tuple[int, int] | None = None  # (current, the GPU's max)
    pcie_width: tuple[int, int] | None = None

    def problems(self) -> list[Problem]:
        """What is wrong, worst first."""
        found = [*_memory(self), *_clocks_and_link(self)]
        order = {ERROR: 0, WARN: 1, INFO: 2}
        return sorted(found, key=lambda p: order[p.level])


def _memory(gpu: GpuHealth) -> list[Problem]:
    found = []
    if gpu.uncorrectable_volatile:
        found.append(
            Problem(
                ERROR,
                "ecc",
                f"{gpu.uncorrectable_volatile} uncorrectable ECC error(s) since the driver loaded",
            )
        )
    elif gpu.uncorrectable_aggregate:
        found.append(
            Problem(
                WARN,
                "ecc",
                f"{gpu.uncorrectable_aggregate} uncorrectable ECC error(s) in its lifetime",
            )
        )
    if gpu.retired_pending:
        found.append(
            Problem(
                ERROR, "retired-pages", "a page retirement is pending: reset the GPU (or reboot)"
            )
        )
    if gpu.remap_failed:
        found.append(
            Problem(ERROR, "remapped-rows", "a row remapping failed: the GPU needs replacing")
        )
    if gpu.remap_pending:
        found.append(
            Problem(ERROR, "remapped-rows", "a row remapping is pending: reset the GPU (or reboot)")
        )
    if gpu.retired_dbe:
        found.append(
            Problem(
                WARN, "retired-pages", f"{gpu.retired_dbe} page(s) retired for double-bit errors"
            )
        )
    if gpu.remapped_uncorrectable:
        rows = gpu.remapped_uncorrectable
        found.append(
            Problem(WARN, "remapped-rows", f"{rows} row(s) remapped for uncorrectable errors")
        )
    if gpu.retired_sbe:
        found.append(
            Problem(
                INFO, "retired-pages", f"{gpu.retired_sbe} page(s) retired for single-bit errors"
            )
        )
    return found


def _clocks_and_link(gpu: GpuHealth) -> list[Problem]:
    found = []
    if gpu.clocks_held:
        found.append(Problem(WARN, "clocks", f"clocks held down: {', '.join(gpu.clocks_held)}"))
    if gpu.power_capped:
        found.append(Problem(INFO, "clocks", "at its power cap (usual under full load)"))
    if gpu.pcie_width and gpu.pcie_width[0] < gpu.pcie_width[1]:
        now, most = gpu.pcie_width
        found.append(
            Problem(
                WARN, "pcie", f"PCIe link x{now} of the GPU's x{most} (a seating or riser fault)"
            )
        )
    if gpu.pcie_gen and gpu.pcie_gen[0] < gpu.pcie_gen[1]:
        found.append(
            Problem(
                INFO,
                "pcie",
                f"PCIe gen {gpu.pcie_gen[0]} of {gpu.pcie_gen[1]}"
                " (usual while idle; not under load)",
            )
        )
    if gpu.persistence is False:
        found.append(
            Problem(
                INFO,
                "persistence",
                "persistence mode off (each process waits for the driver to start)",
            )
        )
    return found


# -- nvidia-smi -q ---------------------------------------------------------------------

_GPU = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*$")
# reasons that slow a busy GPU for a fault (heat, power delivery); SW Power Cap is usual
# under load, Idle and the settings are not faults
_HELD = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")


def parse_query(text: str) -> list[GpuHealth]:
    """Every GPU block of `nvidia-smi -q`'s text (none: no GPU, or not that format)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _GPU.match(line)
        if match:
            blocks.append((match.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    return [_gpu(bus, _tree(lines)) for bus, lines in blocks]


def _tree(lines: Sequence[str]) -> Tree:
    """`Key : value` lines, nested by indentation, as dicts (a line without a colon opens
    a section)."""
    root: Tree = {}
    stack: list[tuple[int, Tree]] = [(-1, root)]
    for line in lines:
        text = line.strip()
        if not text:
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        here = stack[-1][1]
        leaf = _LEAF.match(text)
        if leaf:
            here[leaf.group(1)] = leaf.group(2).strip()
        else:
            section: Tree = {}
            here[text] = section
            stack.append((indent, section))
    return root


_LEAF = re.compile(r"^([^:]*?)\s*:\s?(.*)$")


def _at(tree: Any, *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _int(value: Any) -> int | None:
    match = re.match(r"\s*(\d+)", value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def _yes(value: Any) -> bool | None:
    if value in ("Yes", "Enabled", "Active"):
        return True
    if value in ("No", "Disabled", "Not Active"):
        return False
    return None


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uncorrectable(ecc: Any) -> int | None:
    """Ampere and later: SRAM (one count, or Parity and SEC-DED) and DRAM Uncorrectable;
    Volta and older: the Double Bit Total."""
    if not isinstance(ecc, Mapping):
        return None
    if isinstance(ecc.get("Double Bit"), Mapping):
        return _int(ecc["Double Bit"].get("Total"))
    keys = [k for k in ecc if "Uncorrectable" in k and not isinstance(ecc[k], Mapping)]
    return _sum([_int(ecc[k]) for k in keys])


def _correctable(ecc: Any) -> int | None:
    if not isinstance(ecc, Mapping):
        return None
    if isinstance(ecc.get("Single Bit"), Mapping):
        return _int(ecc["Single Bit"].get("Total"))
    return _sum([_int(ecc[k]) for k in ecc if k.endswith("Correctable") and "Un" not in k])


def _pair(section: Any) -> tuple[int, int] | None:
    """(current, the GPU's own max): "Device Max" where the driver says it (535+: "Max" is
    then what the host allows too), else "Max"."""
    now = _int(_at(section, "Current"))
    top = _int(_at(section, "Device Max")) or _int(_at(section, "Max"))
    return (now, top) if now is not None and top is not None else None


def _gpu(bus: str, tree: Tree) -> GpuHealth:
    domain, rest = bus.split(":", 1)
    short = f"{domain[-4:]}:{rest.rsplit('.', 1)[0]}".lower()
    reasons = tree.get("Clocks Event Reasons") or tree.get("Clocks Throttle Reasons") or {}
    flat = _flatten(reasons) if isinstance(reasons, Mapping) else {}
    link = _at(tree, "PCI", "GPU Link Info") or {}
    remapped = tree.get("Remapped Rows")
    retired = tree.get("Retired Pages") or {}
    return GpuHealth(
        bus=short,
        name=str(tree.get("Product Name", "")),
        persistence=_yes(tree.get("Persistence Mode")),
        uncorrectable_volatile=_uncorrectable(_at(tree, "ECC Errors", "Volatile")),
        uncorrectable_aggregate=_uncorrectable(_at(tree, "ECC Errors", "Aggregate")),
        correctable_volatile=_correctable(_at(tree, "ECC Errors", "Volatile")),
        retired_sbe=_int(_at(retired, "Single Bit ECC")),
        retired_dbe=_int(_at(retired, "Double Bit ECC")),
        retired_pending=_yes(
            _at(retired, "Pending Page Blacklist") or _at(retired, "Pending Page Retirement")
        ),
        remapped_correctable=_int(_at(remapped, "Correctable Error")),
        remapped_uncorrectable=_int(_at(remapped, "Uncorrectable Error")),
        remap_pending=_yes(_at(remapped, "Pending")),
        remap_failed=_yes(_at(remapped, "Remapping Failure Occurred")),
        clocks_held=tuple(r for r in _HELD if flat.get(r) == "Active"),
        power_capped=flat.get("SW Power Cap") == "Active",
        pcie_gen=_pair(_at(link, "PCIe Generation")),
        pcie_width=_pair(_at(link, "Link Width")),
    )


def _flatten(section: Mapping[str, Any]) -> dict[str, str]:
    """A section's values at every depth (HW Thermal Slowdown sits under HW Slowdown)."""
    out: dict[str, str] = {}
    for key, value in section.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value))
        else:
            out[key] = value
    return out


# -- Xid lines from the kernel log ---------------------------------------------------------

# NVIDIA's Xid catalog: what each means, and whether the GPU needs a reset or more (ERROR),
# may (WARN), or the error is most often the application's own (INFO)
XID: dict[int, tuple[str, str]] = {
    13: (INFO, "graphics engine exception (most often the application)"),
    31: (INFO, "GPU memory page fault (most often the application)"),
    32: (INFO, "invalid or corrupted push buffer stream"),
    43: (INFO, "a channel stopped on an error (the application's)"),
    45: (INFO, "a channel was ended (after another error, or a stop)"),
    48: (ERROR, "double-bit ECC error"),
    61: (WARN, "internal micro-controller breakpoint"),
    62: (WARN, "internal micro-controller halt"),
    63: (WARN, "a row remapping or page retirement was recorded: reset to apply it"),
    64: (ERROR, "a row remapping or page retirement failed"),
    74: (ERROR, "NVLink error"),
    79: (ERROR, "the GPU has fallen off the bus"),
    92: (WARN, "high single-bit ECC error rate"),
    94: (WARN, "contained ECC error (the application that met it must restart)"),
    95: (ERROR, "uncontained ECC error: reset the GPU"),
    109: (WARN, "context switch timeout"),
    119: (ERROR, "GSP RPC timeout: reset the GPU"),
    120: (ERROR, "GSP error: reset the GPU"),
    140: (ERROR, "unrecovered ECC error"),
    149: (ERROR, "NVLink network error"),
    154: (ERROR, "the driver asks for a recovery action"),
}
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+), (.*)$")
_OFF_BUS = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+) .*fallen off the bus")


@dataclass(frozen=True)
class Xid:
    bus: str  # 0000:19:00
    code: int
    text: str  # the driver's words after the code
    count: int = 1  # how many such lines

    @property
    def level(self) -> str:
        return XID.get(self.code, (WARN, ""))[0]

    @property
    def meaning(self) -> str:
        return XID.get(self.code, (WARN, "see NVIDIA's Xid catalog"))[1]


def parse_xids(text: str) -> list[Xid]:
    """The Xid events in a kernel log (any of dmesg's time formats, journalctl's), one per
    GPU and code with how many lines said it, in the order first seen; a GPU "fallen off
    the bus" without an Xid line (the driver's message over several lines) counts as 79."""
    seen: dict[tuple[str, int], Xid] = {}
    for line in _joined(text):
        match, off = _XID.search(line), _OFF_BUS.search(line)
        if match:
            found = Xid(_bus(match.group(1)), int(match.group(2)), _words(match.group(3)))
        elif off:
            found = Xid(_bus(off.group(1)), 79, "fallen off the bus")
        else:
            continue
        key = (found.bus, found.code)
        seen[key] = replace(seen[key], count=seen[key].count + 1) if key in seen else found
    return list(seen.values())


def _joined(text: str) -> list[str]:
    """Lines, a continuation (indented `NVRM:` without a time) joined to the one before."""
    lines: list[str] = []
    for line in text.splitlines():
        if lines and re.match(r"^\s+NVRM: ", line):
            lines[-1] += " " + line.strip().removeprefix("NVRM: ")
        else:
            lines.append(line)
    return lines


def _bus(pci: str) -> str:
    """PCI:0000:19:00 (an Xid's) or 0000:19:00.0 (a message's) as 0000:19:00."""
    parts = pci.split(".")[0].split(":")
    return ":".join([parts[-3][-4:], *parts[-2:]]).lower() if len(parts) >= 3 else pci.lower()


def _words(rest: str) -> str:
    """The driver's words, without `pid=..., name=...,` and with runs of spaces as one."""
    rest = re.sub(r"^pid=[^,]*, (name=[^,]*, )?", "", rest)
    return re.sub(r"\s+", " ", rest).strip()


# -- one host: its GPUs, its kernel log's Xids, its RDMA devices (hostside/gpu_health.sh) --


@dataclass(frozen=True)
class HostHealth:
    """What gpu_health.sh found on a host."""

    gpus: tuple[GpuHealth, ...] = ()
    xids: tuple[Xid, ...] = ()
    smi: str = "ok"  # ok, none (no nvidia-smi), or `failed N: its last words`
    kernel: str = ""  # where the kernel log came from, "unreadable", or ""
    rdma: tuple[str, ...] = ()  # RDMA devices (mlx5_0: InfiniBand/RoCE, efa_0: AWS EFA)

    def problems(self) -> list[tuple[str, Problem]]:
        """(the GPU, the problem) for every GPU's problems and every Xid, worst first; an
        Xid on a GPU names it by its bus id."""
        names = {g.bus: g.name for g in self.gpus}
        found = [(f"GPU {g.bus}", p) for g in self.gpus for p in g.problems()]
        for xid in self.xids:
            gpu = f"GPU {xid.bus}" + (f" ({names[xid.bus]})" if xid.bus in names else "")
            times = f" x{xid.count}" if xid.count > 1 else ""
            found.append(
                (
                    gpu,
                    Problem(
                        xid.level, "xid", f"Xid {xid.code}{times} in the kernel log: {xid.meaning}"
                    ),
                )
            )
        if self.smi.startswith("failed"):
            found.append(("nvidia-smi", Problem(ERROR, "driver", self.smi)))  # the driver
        order = {ERROR: 0, WARN: 1, INFO: 2}
        return sorted(found, key=lambda item: order[item[1].level])

    def flags(self) -> dict[int, tuple[str, ...]]:
        """Short flags per GPU index (`-q` lists the GPUs in nvidia-smi's index order) for
        what is wrong or slows it: ECC, PAGES, REMAP, XID 79, SLOW, PCIe x8 (watch-gpus)."""
        short = {"ecc": "ECC", "retired-pages": "PAGES", "remapped-rows": "REMAP", "clocks": "SLOW"}
        by_bus: dict[str, list[str]] = {}
        for gpu in self.gpus:
            found = by_bus.setdefault(gpu.bus, [])
            for p in gpu.problems():
                if p.level == INFO:
                    continue
                flag = short.get(p.what, p.what.upper())
                if p.what == "pcie" and gpu.pcie_width:
                    flag = f"PCIe x{gpu.pcie_width[0]}"
                if flag not in found:
                    found.append(flag)
        for xid in self.xids:
            if xid.level != INFO and xid.bus in by_bus:
                by_bus[xid.bus].append(f"XID {xid.code}")
        return {i: tuple(by_bus[g.bus]) for i, g in enumerate(self.gpus) if by_bus[g.bus]}

    @property
    def worst(self) -> str:
        """ERROR, WARN, INFO, or "" when nothing is wrong."""
        found = self.problems()
        return found[0][1].level if found else ""

    def lines(self, at_least: str = WARN) -> list[str]:
        """Each problem at `at_least` or worse, as said: `GPU 0000:19:00: Xid 79 ...`."""
        rank = {ERROR: 0, WARN: 1, INFO: 2}
        return [f"{gpu}: {p.text}" for gpu, p in self.problems() if rank[p.level] <= rank[at_least]]


def parse_host(text: str) -> HostHealth:
    """gpu_health.sh's output."""
    sections: dict[str, list[str]] = {}
    heads: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("== "):
            word, _, rest = line[3:].partition(" ")
            current, heads[word] = word, rest
            sections[word] = []
        elif current:
            sections[current].append(line)
    smi = heads.get("nvidia-smi", "none")
    gpus: list[GpuHealth] = []
    if smi == "-q":
        gpus, smi = parse_query("\n".join(sections["nvidia-smi"])), "ok"
    elif smi.startswith("failed"):
        said = " ".join(x.strip() for x in sections.get("nvidia-smi", []) if x.strip())
        smi = f"{smi}: {said}".strip()
    kernel = heads.get("kernel", "")
    xids = parse_xids("\n".join(sections.get("kernel", []))) if kernel != "unreadable" else []
    rdma = tuple(x.strip() for x in sections.get("rdma", []) if x.strip())
    return HostHealth(tuple(gpus), tuple(xids), smi, kernel, rdma)


def read_host(conn: Connection, nvidia_smi: str = "nvidia-smi") -> HostHealth:
    """The host's health, in one round trip (hostside/gpu_health.sh)."""
    from vmrun import hostside
    from vmrun.ssh.channel import run_for_output

    argv = hostside.command("gpu_health.sh", nvidia_smi)
    _, text = run_for_output(conn, argv, what="the GPUs' health", activity=False)
    return parse_host(text)
