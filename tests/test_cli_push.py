"""`vmrun push` on real sshd hosts: a tree with hostile names arrives exact on every host,
a second push sends nothing, a cut push leaves no file under its final name and the next
push completes it, a folder the user cannot write and a full disk are refused before
anything is sent, a missing source starts nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, error_in, errors_in, wait_for
from testbed import NetnsBed, TestHost

from vmrun.transfer.manifest import PART_SUFFIX

HOSTILE = ["plain.bin", "with space.txt", "new\nline.txt", "-leading-dash", "sub/dir/deep.txt"]
NON_UTF8 = os.fsdecode(b"caf\xe9-latin1.txt")


def _tree(root: Path) -> dict[str, bytes]:
    made = {}
    for index, rel in enumerate([*HOSTILE, NON_UTF8]):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).digest() * (64 + index)
        path.write_bytes(data)
        made[rel] = data
    (root / "outside-link").symlink_to("/etc/hostname")  # never followed out of the tree
    return made


@pytest.fixture
def data(bed_client: Client) -> Iterator[tuple[Path, dict[str, bytes]]]:
    root = bed_client.cwd / "data"
    made = _tree(root)
    yield root, made
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def hosts2(bed: NetnsBed) -> Iterator[tuple[TestHost, TestHost]]:
    h1, h2 = bed.host("h1"), bed.host("h2")
    yield h1, h2
    for host in (h1, h2):
        shutil.rmtree(host.home / "pushed", ignore_errors=True)


def _arrived(host: TestHost, made: dict[str, bytes]) -> dict[str, bytes]:
    base = host.home / "pushed" / "data"
    return {rel: (base / rel).read_bytes() for rel in made if (base / rel).is_file()}


def test_a_tree_with_hostile_names_arrives_exact_and_twice_sends_nothing(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    root, made = data
    first = bed_client.vmrun("push", "data", "--to", "~/pushed", "-H", "h1", "-H", "h2")
    assert first.returncode == 0, first.stderr + first.stdout
    for host in hosts2:
        assert _arrived(host, made) == made
        assert not (host.home / "pushed" / "data" / "outside-link").exists()
        assert not list((host.home / "pushed").rglob(f"*{PART_SUFFIX}"))
    second = bed_client.vmrun("push", "data", "--to", "~/pushed", "-H", "h1", "-H", "h2", "--json")
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    assert [p["sent"] for h in report["hosts"] for p in h["paths"]] == [0, 0]
    (root / "plain.bin").write_bytes(b"changed")
    plan = bed_client.vmrun("push", "data", "--to", "~/pushed", "-H", "h1", "--dry-run", "--json")
    (path,) = json.loads(plan.stdout)["hosts"][0]["paths"]
    assert (path["to_send"], path["files"]) == (1, len(made))
    assert (hosts2[0].home / "pushed" / "data" / "plain.bin").read_bytes() == made["plain.bin"]


def test_bad_input_is_refused_before_anything_is_sent(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    missing = bed_client.vmrun("push", "nosuch", "-H", "h1")
    assert (missing.returncode, error_in(missing.stderr)[0]) == (2, "source-not-found")
    refused = bed_client.vmrun("push", "data", "--to", "/proc/vmrun-push", "-H", "h1", "-H", "h2")
    assert refused.returncode == 2, refused.stderr
    assert [c for c, _ in errors_in(refused.stderr)] == ["target-not-writable"] * 2
    # a disk too small: the check runs before any byte travels (a 1 MiB tmpfs would need
    # root in the host; the check's own verdict is tested with a fake df in the quick tier)


def test_the_project_work_directory_is_the_default(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    done = bed_client.vmrun("push", "data/plain.bin", "-H", "h1", "--json")
    assert done.returncode == 0, done.stderr
    remote = json.loads(done.stdout)["hosts"][0]["paths"][0]["remote"]
    assert remote.startswith("vmrun/") and remote.endswith("/plain.bin")
    assert (hosts2[0].home / remote).read_bytes() == data[1]["plain.bin"]
    shutil.rmtree(hosts2[0].home / "vmrun", ignore_errors=True)


def test_train_data_pushes_to_every_node_and_records_it(multi: Client) -> None:
    made = _tree(multi.cwd / "data")
    (multi.cwd / "data" / "outside-link").unlink()
    done = multi.vmrun("train", "--data", "data", "--epochs", "1", "--save-every", "1", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    fetched = multi.vmrun("fetch", "logs", "--all-hosts")
    assert fetched.returncode == 0, fetched.stderr
    records = [json.loads(p.read_text()) for p in multi.cwd.rglob("run.json")]
    assert len(records) == 2, records
    data = [r["data"][0] for r in records]
    assert {d["files"] for d in data} == {len(made)}
    assert data[0]["manifest"] and data[0]["manifest"] == data[1]["manifest"]
    assert data[0]["remote"].endswith("/data")
    refused = multi.vmrun("train", "--local", "--data", "data")
    assert (refused.returncode, error_in(refused.stderr)[0]) == (2, "flags-conflict")


def test_doctor_says_whether_every_host_holds_the_same_data(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    pushed = bed_client.vmrun("push", "data", "--to", "~/pushed", "-H", "h1", "-H", "h2")
    assert pushed.returncode == 0, pushed.stderr
    args = ["doctor", "-H", "h1", "-H", "h2", "--no-allreduce", "--data", "~/pushed/data"]
    same = bed_client.vmrun(*args)
    assert re.search(r"^data\s+all\s+OK", same.stdout, re.M), same.stdout
    (hosts2[1].home / "pushed" / "data" / "plain.bin").write_bytes(b"other")
    differs = bed_client.vmrun(*args)
    assert re.search(r"^data\s+all\s+FAIL\s+.*differs", differs.stdout, re.M), differs.stdout
    assert differs.returncode == 1
    again = bed_client.vmrun("push", "data", "--to", "~/pushed", "-H", "h1", "-H", "h2", "--json")
    sent = [p["sent"] for h in json.loads(again.stdout)["hosts"] for p in h["paths"]]
    assert sent == [0, 1]  # only the file that differs travels, to the host where it differs


def test_delete_removes_only_what_is_not_here_and_only_when_asked(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    _root, made = data
    args = ["push", "data", "--to", "~/pushed", "-H", "h1"]
    assert bed_client.vmrun(*args).returncode == 0
    there = hosts2[0].home / "pushed" / "data"
    (there / "stale.bin").write_bytes(b"old")
    (there / "-stale dash").write_bytes(b"old")
    kept = bed_client.vmrun(*args)
    assert kept.returncode == 0 and (there / "stale.bin").exists()
    plan = json.loads(bed_client.vmrun(*args, "--delete", "--dry-run", "--json").stdout)
    assert plan["hosts"][0]["paths"][0]["not_here"] == ["-stale dash", "stale.bin"]
    assert (there / "stale.bin").exists()
    gone = bed_client.vmrun(*args, "--delete")
    assert gone.returncode == 0, gone.stderr
    assert not (there / "stale.bin").exists() and not (there / "-stale dash").exists()
    assert _arrived(hosts2[0], made) == made


def test_what_a_cut_push_left_whole_is_placed_not_sent_again(
    bed_client: Client, hosts2: tuple[TestHost, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    from vmrun.transfer.manifest import part_name

    root, made = data
    args = ["push", "data", "--to", "~/pushed", "-H", "h1", "--json"]
    assert bed_client.vmrun(*args).returncode == 0
    there = hosts2[0].home / "pushed" / "data"
    st = (root / "sub" / "dir" / "deep.txt").stat()
    # what a push cut after this file's last byte leaves: its temporary copy, whole
    part = there / "sub" / "dir" / part_name("deep.txt", st.st_size, st.st_mtime_ns)
    (there / "sub" / "dir" / "deep.txt").rename(part)
    # and one cut in its middle: never under the final name, sent again in full
    half = there / part_name(
        "plain.bin", len(made["plain.bin"]), (root / "plain.bin").stat().st_mtime_ns
    )
    (there / "plain.bin").rename(half)
    half.write_bytes(made["plain.bin"][:100])
    again = bed_client.vmrun(*args)
    assert again.returncode == 0, again.stderr
    (path,) = json.loads(again.stdout)["hosts"][0]["paths"]
    assert (path["sent"], path["resumed"]) == (2, 1)
    assert path["bytes_sent"] == len(made["plain.bin"])  # deep.txt's bytes did not travel again
    assert _arrived(hosts2[0], made) == made
    assert not list(there.rglob(f"*{PART_SUFFIX}"))


def test_a_big_file_cut_in_its_middle_is_continued_not_sent_again(
    bed_client: Client, hosts2: tuple[TestHost, TestHost]
) -> None:
    from vmrun.transfer.manifest import part_name

    blob = os.urandom(2 << 20)
    (bed_client.cwd / "one.bin").write_bytes(blob)
    args = ["push", "one.bin", "--to", "~/pushed", "-H", "h1", "--json"]
    assert bed_client.vmrun(*args).returncode == 0
    there = hosts2[0].home / "pushed"
    st = (bed_client.cwd / "one.bin").stat()
    part = there / part_name("one.bin", st.st_size, st.st_mtime_ns)
    (there / "one.bin").rename(part)
    os.truncate(part, 700_000)  # what a push cut after 700,000 bytes leaves
    again = bed_client.vmrun(*args)
    assert again.returncode == 0, again.stderr
    (path,) = json.loads(again.stdout)["hosts"][0]["paths"]
    assert (path["sent"], path["resumed"], path["bytes_sent"]) == (1, 1, len(blob) - 700_000)
    assert (there / "one.bin").read_bytes() == blob and not part.exists()
    part.write_bytes(b"x" * 700_000)  # a leftover that is not this file's start
    (there / "one.bin").unlink()
    third = bed_client.vmrun(*args)
    assert third.returncode == 0, third.stderr  # refused on arrival, then sent whole
    assert (there / "one.bin").read_bytes() == blob and not part.exists()
    shutil.rmtree(there)
    (bed_client.cwd / "one.bin").unlink()


def test_a_link_cut_mid_push_leaves_no_half_file_and_the_next_push_resumes(
    bed: NetnsBed, bed_client: Client, hosts2: tuple[TestHost, TestHost]
) -> None:
    h1 = hosts2[0]
    root = bed_client.cwd / "big"
    root.mkdir()
    made = {f"f{i}.bin": os.urandom(3 << 20) for i in range(6)}
    for name, blob in made.items():
        (root / name).write_bytes(blob)
    there = h1.home / "pushed" / "big"
    proc = bed_client.popen(
        "push",
        "big",
        "--to",
        "~/pushed",
        "-H",
        "h1",
        "--bwlimit",
        "3M",
        env={"VMRUN_KEEPALIVE_INTERVAL": "1"},
    )
    try:

        def two_placed() -> bool:  # each file is verified and placed as soon as it is whole
            return sum((there / n).exists() for n in made) >= 2

        wait_for(two_placed, 30, "two files verified and placed on the host")
        h1.cut_link()
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            h1.heal_link()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (12, 13, 14), err  # the link went: lost, or the stream broke
    placed = [n for n in made if (there / n).exists()]
    assert len(placed) < len(made)  # cut before the end
    assert all((there / n).read_bytes() == made[n] for n in placed)  # never a half file
    cut = [p for p in there.glob(f"*{PART_SUFFIX}") if 0 < p.stat().st_size < 3 << 20]
    kept = sum(p.stat().st_size for p in cut)  # a file cut in its middle: continued
    again = bed_client.vmrun("push", "big", "--to", "~/pushed", "-H", "h1", "--json")
    assert again.returncode == 0, again.stderr
    (path,) = json.loads(again.stdout)["hosts"][0]["paths"]
    assert path["unchanged"] >= 2 and path["resumed"] == len(cut)
    assert path["bytes_sent"] == (len(made) - len(placed)) * (3 << 20) - kept
    assert {n: (there / n).read_bytes() for n in made} == made
    assert not list(there.glob(f"*{PART_SUFFIX}"))
    shutil.rmtree(root)


def _private_hosts(
    client: Client, cluster: dict[str, TestHost], names: list[str], bogus: str = ""
) -> None:
    """vmrun.toml: `names` with their inner addresses as private_addr; `bogus` with an
    inner address nobody has (its private network is out of everyone's reach)."""
    toml = "".join(
        f'[[hosts]]\naddress = "{n}"\nprivate_addr = "{cluster[n].addr_on("inner")}"\n\n'
        for n in names
    )
    if bogus:
        nobody = cluster["n1"].addr_on("inner").rsplit(".", 1)[0] + ".250"
        toml += f'[[hosts]]\naddress = "{bogus}"\nprivate_addr = "{nobody}"\n'
    (client.cwd / "vmrun.toml").write_text(toml)


@pytest.fixture
def inner(bed_client: Client, cluster: dict[str, TestHost], bed: NetnsBed) -> Iterator[Client]:
    yield bed_client
    (bed_client.cwd / "vmrun.toml").unlink(missing_ok=True)
    for host in [*cluster.values(), bed.host("h1")]:
        shutil.rmtree(host.home / "pushed", ignore_errors=True)


def _clean(host: TestHost) -> None:
    keys = (host.home / ".ssh" / "authorized_keys").read_text()
    state = host.home / ".vmrun" / "relay"
    assert "vmrun-relay-" not in keys and not (state.exists() and any(state.iterdir()))


def test_folders_cross_once_then_go_host_to_host(
    inner: Client, cluster: dict[str, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    _root, made = data
    _private_hosts(inner, cluster, ["n1", "n2", "n3"])
    done = inner.vmrun("push", "data", "--to", "~/pushed", "--json", timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout  # --json: a host's error is in stdout
    via = {h["host"]: h["via"] for h in json.loads(done.stdout)["hosts"]}
    first = [h for h, v in via.items() if v is None]
    assert len(first) == 1, (via, done.stderr)  # one got it from here, the others host to host
    assert all(v in ("n1", "n2", "n3") for h, v in via.items() if h not in first)
    for host in cluster.values():
        assert _arrived_in(host, made) == made, host.name
        _clean(host)
    again = inner.vmrun("push", "data", "--to", "~/pushed", "--json", timeout=120)
    sent = [p["sent"] for h in json.loads(again.stdout)["hosts"] for p in h["paths"]]
    assert sent == [0, 0, 0], again.stdout


def test_hosts_that_reach_each_other_relay_without_being_told(
    inner: Client, cluster: dict[str, TestHost], data: tuple[Path, dict[str, bytes]]
) -> None:
    """No private_addr: n1 and n2 are reached at the addresses vmrun dials (their ssh
    config's), which they reach too (asked once): one gets it from here, the other from it;
    n3, behind the bastion, has no address the others could use and gets it from here.
    --json says when each hop began and ended."""
    _root, made = data
    (inner.cwd / "vmrun.toml").write_text(
        "".join(f'[[hosts]]\naddress = "{n}"\n\n' for n in ("n1", "n2", "n3"))
    )
    done = inner.vmrun("push", "data", "--to", "~/pushed", "--json", timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout  # --json: a host's error is in stdout
    hosts = json.loads(done.stdout)["hosts"]
    via = {h["host"]: h["via"] for h in hosts}
    assert via["n3"] is None, via
    (first,) = [h for h in ("n1", "n2") if via[h] is None]
    (second,) = [h for h in ("n1", "n2") if h != first]
    assert via[second] == first, via
    began = {h["host"]: h["began_s"] for h in hosts}
    ended = {h["host"]: h["ended_s"] for h in hosts}
    assert began[second] >= ended[first], (began, ended)
    for host in cluster.values():
        assert _arrived_in(host, made) == made, host.name
        _clean(host)


def test_a_host_out_of_reach_host_to_host_gets_the_data_from_here(
    inner: Client,
    cluster: dict[str, TestHost],
    bed: NetnsBed,
    data: tuple[Path, dict[str, bytes]],
) -> None:
    _root, made = data
    _private_hosts(inner, cluster, ["n1"], bogus="h1")
    done = inner.vmrun("push", "data", "--to", "~/pushed", "--json", timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout  # --json: a host's error is in stdout
    assert "gets the data from here" in done.stderr or "sending from here" in done.stderr
    assert {h["host"]: h["via"] for h in json.loads(done.stdout)["hosts"]} == {
        "n1": None,
        "h1": None,
    }
    for host in (cluster["n1"], bed.host("h1")):
        assert _arrived_in(host, made) == made, host.name
        _clean(host)


def _arrived_in(host: TestHost, made: dict[str, bytes]) -> dict[str, bytes]:
    base = host.home / "pushed" / "data"
    return {rel: (base / rel).read_bytes() for rel in made if (base / rel).is_file()}


def test_doctor_removes_a_host_to_host_key_a_killed_push_left(
    bed_client: Client, hosts2: tuple[TestHost, TestHost]
) -> None:
    from vmrun.transfer.relay import authorized_line, new_tag, transfer_key

    h1 = hosts2[0]
    keys = h1.home / ".ssh" / "authorized_keys"
    before = keys.read_text()
    _private, public = transfer_key()
    keys.write_text(before + authorized_line(public, new_tag(), "10.231.9.9") + "\n")
    done = bed_client.vmrun("doctor", "-H", "h1", "--no-allreduce")
    assert re.search(r"^relay\s+h1\s+WARN\s+removed 1 ", done.stdout, re.M), done.stdout
    assert keys.read_text() == before


def test_a_cluster_gets_the_data_once_on_its_shared_filesystem(
    slurm_cluster: Any, slurm_client: Client
) -> None:
    made = _tree(slurm_client.cwd / "data")
    done = slurm_client.vmrun("push", "data", "-C", "bed", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    (host,) = json.loads(done.stdout)["hosts"]
    remote = host["paths"][0]["remote"]
    base = Path(remote) if remote.startswith("/") else slurm_cluster.login.home / remote
    from vmrun.remote_paths import remote_workdir

    assert remote.endswith(f"/{remote_workdir(slurm_client.cwd)}/data"), remote  # the jobs' cwd
    assert {rel: (base / rel).read_bytes() for rel in made} == made
    both = slurm_client.vmrun("push", "data", "-C", "bed", "-H", "login")
    assert (both.returncode, error_in(both.stderr)[0]) == (2, "flags-conflict")
