"""What `vmrun setup --slurm NAME` and `--slurm-remove` print: each node's line (what changed
on it, its services, its state in sinfo), then how to use the cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmrun.cli.output import say

if TYPE_CHECKING:
    from vmrun.queue.making import Made, Removed


def render_made(made: Made, recorded_in: object) -> int:
    for node in made.nodes:
        role = " (controller)" if node.host == made.controller else ""
        state = made.states.get(node.hostname, "?")
        parts: list[str] = []
        if node.touched:
            if node.installed:
                parts.append(f"installed {' '.join(node.installed)}")
            if node.changed:
                parts.append("wrote " + ", ".join(node.changed))
            moved = [f"{unit} {how}" for unit, how in node.services.items() if how != "running"]
            parts += moved
        did = "; ".join(parts) or "unchanged"
        say(f"{node.host}{role}: node {node.hostname} {state}: {did}")
    for host in made.taken_out:
        say(f"{host}: taken out of the cluster")
    versions = ", ".join(f"{p} {v}" for p, v in sorted(made.versions.items()))
    named = ", ".join(
        f"{p} ({len(n)} node{'s' if len(n) != 1 else ''})" for p, n in made.partitions.items()
    )
    say(
        f"cluster {made.name}: {len(made.nodes)} node(s) in service, partitions {named}"
        + (f"; {versions}" if versions else "")
        + ("" if made.changed else "; nothing changed")
        + f" ({made.seconds:.1f}s)"
    )
    if made.shared:
        where = f"jobs work in {made.shared} (one folder on every host)"
    else:
        where = (
            "no shared folder (--shared PATH names one): each run's project is synced to"
            " every node, and its log and results stay on the node its job ran on"
        )
    say(f"{where}; recorded as [[clusters]] {made.name} in {recorded_in}")
    if made.accounting:
        say(
            f"accounting: slurmdbd on {made.controller} (its database in MariaDB there);"
            " `sacct` lists every job"
        )
    say(f"use it: vmrun train -C {made.name} ...  |  vmrun sweep -C {made.name} ...")
    return 0


def render_removed(removed: Removed) -> int:
    for host, lines in removed.hosts.items():
        did = ", ".join(line.lower() for line in lines if line != "GONE") or "nothing of it left"
        kept = removed.kept.get(host)
        say(f"{host}: {did}" + (f"; packages kept: {kept}" if kept else ""))
    say(
        f"cluster {removed.name} removed and forgotten in vmrun.toml; the hosts take"
        " `vmrun train -H` again"
    )
    return 0
