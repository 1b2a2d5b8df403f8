"""vmrun.providers.ucloud.provider against the UCloud STAND-IN (tests/testbed/ucloud.py) as
its transport (quick tier): VMs as jobs that queue before they run, their SSH line, the
user's key registered once, tokens that expire mid-`up`, UCloud's refusals, a job that never
announces SSH (terminated, refused), describe / stop / start / terminate by label."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from testbed.ucloud import API_TOKEN, REFRESH, FakeUCloud

from vmrun.errors import CloudError, UsageError
from vmrun.providers.api import Request
from vmrun.providers.ucloud.provider import UCloudProvider, subdomain_for
from vmrun.providers.ucloud.session import Session
from vmrun.reporting import Recorder

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9k0test user@laptop"


def provider(fake: FakeUCloud, token: str = REFRESH, **kw: float) -> UCloudProvider:
    session = Session(token, url="http://ucloud.test", project="p-lab", transport=fake)
    return UCloudProvider(session, poll=0.0, **kw)  # type: ignore[arg-type]


def request(count: int = 2, **kw: object) -> Request:
    return Request(
        cluster="uc",
        instance_type="u1-standard-2",
        count=count,
        public_key=KEY,
        creator="me@laptop",
        **kw,
    )  # type: ignore[arg-type]


def test_up_makes_a_job_per_node_waits_through_the_queue_and_reads_each_ssh_line() -> None:
    fake = FakeUCloud(
        queue_polls=2, boot=lambda job: ("ucloud", f"130.225.0.{job['id'][-1]}", 2200)
    )
    cloud = provider(fake)
    out = Recorder()
    offer = cloud.offer(request())
    assert (offer.region, offer.image_id, offer.user) == ("ucloud", "vm-ubuntu/24.04", "ucloud")
    made = cloud.launch(request(), offer, out)
    assert [(i.index, i.state, i.ssh_port) for i in made] == [
        (0, "running", 2200),
        (1, "running", 2200),
    ]
    assert made[0].public_addr.startswith("130.225.0.") and made[0].login_user == "ucloud"
    assert sum("is queued at UCloud" in line for line in out.lines) == 2, out.lines
    specs = [job["specification"] for job in fake.jobs.values()]
    assert [s["name"] for s in specs] == ["uc-0", "uc-1"]
    assert specs[0]["labels"]["vmrun-cluster"] == "uc" and specs[0]["sshEnabled"] is True
    assert [k["specification"]["key"] for k in fake.keys] == [KEY]  # registered once
    other = cloud.launch(replace(request(count=1), cluster="uc2"), offer, Recorder())
    assert len(fake.keys) == 1  # found again by its text, not added twice
    assert set(fake.projects) == {"p-lab"}
    # found by label, stopped (suspended), started (a new SSH line), terminated
    assert [i.id for i in cloud.describe("uc", "")] == [i.id for i in made]
    cloud.stop("uc", "")
    assert [i.state for i in cloud.describe("uc", "", ("stopped",))] == ["stopped"] * 2
    again = cloud.start("uc", "", Recorder())
    assert len(again) == 2 and all(i.state == "running" for i in again)
    gone = cloud.terminate("uc", "")
    assert len(gone.instances) == 2 and gone.left == [] and fake.live() == [other[0].id]


def test_access_tokens_that_expire_mid_up_are_refreshed_and_an_api_token_is_used_as_is() -> None:
    fake = FakeUCloud(access_ttl=0.0)  # every access token has expired when it is used
    with pytest.raises(CloudError) as refused:
        provider(fake).launch(request(count=1), provider(fake).offer(request()), Recorder())
    assert refused.value.code == "cloud-credentials"  # refreshed once per call, still 403
    live = FakeUCloud(access_ttl=0.3)
    cloud = provider(live)
    cloud.launch(request(count=1), cloud.offer(request()), Recorder())
    assert live.refreshed >= 1 and live.live()
    api = FakeUCloud()
    by_token = provider(api, token=API_TOKEN)
    by_token.launch(request(count=1), by_token.offer(request()), Recorder())
    assert api.refreshed == 0 and ("POST", "/auth/refresh") not in api.calls


def test_a_job_that_never_says_where_ssh_is_is_terminated_and_refused_in_one_line() -> None:
    fake = FakeUCloud(announce_ssh=False)
    cloud = provider(fake, ssh_timeout=0.2)
    with pytest.raises(CloudError) as never:
        cloud.launch(request(), cloud.offer(request()), Recorder())
    assert never.value.code == "cloud-ssh-never-up" and "ssh ucloud@" in never.value.one_line()
    assert fake.live() == []  # both jobs terminated


def test_ucloud_s_refusals_and_an_unknown_type_are_one_line_and_leave_nothing() -> None:
    fake = FakeUCloud()
    cloud = provider(fake)
    with pytest.raises(UsageError) as unknown:
        cloud.offer(Request(cluster="uc", instance_type="u9-huge"))
    assert unknown.value.code == "cloud-type-not-offered" and "u1-standard-2" in unknown.value.hint
    fake.refuse("/api/jobs", 400, "Not enough credits in the project")
    fake.jobs.clear()
    with pytest.raises(CloudError) as refused:
        cloud.launch(request(), cloud.offer(request()), Recorder())
    assert "400 Not enough credits in the project" in refused.value.one_line()
    assert fake.live() == []


def test_up_says_the_hourly_cost_in_dkk_first_records_it_and_keeps_a_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UCloud prices in DKK (a ProductV2's price a minute, in millionths): `up` says the
    cluster's hourly cost in DKK before it makes a job, records each host's `price` with
    `currency = "DKK"` (a run's cost is then kept in DKK, never added to dollars), and
    --max-hourly-cost is in the cloud's currency."""
    from vmrun.config import load_settings
    from vmrun.operations import cloud

    fake = FakeUCloud(boot=lambda job: ("ucloud", f"130.225.0.{job['id'][-1]}", 22))
    monkeypatch.setattr(cloud, "provider_for", lambda name, profile: provider(fake))
    monkeypatch.setattr(cloud, "_wait_ssh", lambda *a: None)  # STAND-IN: no sshd here
    monkeypatch.setattr(cloud, "_first_use", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    key = tmp_path / "id.pub"
    key.write_text(KEY + "\n")
    settings = load_settings({}, cwd=tmp_path, environ={})
    ask = cloud.UpAsk(
        "uc",
        cloud="ucloud",
        instance_type="u1-standard-2",
        count=2,
        ssh_key=key,
        max_hourly_cost=4.0,
    )
    with pytest.raises(UsageError) as dear:
        cloud.up(settings, ask, Recorder())
    assert dear.value.code == "over-budget" and "4.20 DKK an hour" in dear.value.message
    assert fake.jobs == {}  # nothing made
    out = Recorder()
    done = cloud.up(settings, replace(ask, max_hourly_cost=5.0), out)
    said = next(i for i, line in enumerate(out.lines) if "about 4.20 DKK an hour" in line)
    assert said < next(i for i, line in enumerate(out.lines) if "running" in line), out.lines
    assert (done.per_hour, done.currency) == (pytest.approx(4.2), "DKK")
    from vmrun.ssh.inventory import select_hosts

    hosts = select_hosts(["@uc"], load_settings({}, cwd=tmp_path, environ={}))
    assert [(h.vars["price"], h.vars["currency"]) for h in hosts] == [(2.1, "DKK")] * 2


def test_clusters_lists_what_vmrun_made_at_ucloud_with_its_price_in_dkk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vmrun clusters --cloud ucloud`: the live VM jobs vmrun labelled (a terminated one
    gone), the running ones at their product's price an hour in DKK, a suspended one free
    now; a cluster no vmrun.toml here names is marked possibly forgotten."""
    from vmrun.cli.cloud_cmd import render
    from vmrun.config import load_settings
    from vmrun.operations.clusters import list_ucloud, project_cloud

    fake = FakeUCloud(boot=lambda job: ("ucloud", f"130.225.0.{job['id'][-1]}", 22))
    cloud = provider(fake)
    offer = cloud.offer(request())
    cloud.launch(request(), offer, Recorder())  # uc: 2 x u1-standard-2 (2.1 DKK/h each)
    cloud.launch(replace(request(count=1), cluster="old"), offer, Recorder())
    cloud.stop("old", "")
    cloud.launch(replace(request(count=1), cluster="gone"), offer, Recorder())
    cloud.terminate("gone", "")
    (tmp_path / "vmrun.toml").write_text(
        '[[clouds]]\nname = "uc"\ncloud = "ucloud"\ntype = "u1-standard-2"\n'
    )
    settings = load_settings({}, cwd=tmp_path, environ={})
    assert project_cloud(settings.project_data) == "ucloud"
    found = list_ucloud(settings, cloud)
    assert sorted((r.cluster, r.state) for r in found.resources) == [
        ("old", "stopped"),
        ("uc", "2-vm(s)"),  # its private network, listed with its VMs (and free)
        ("uc", "running"),
        ("uc", "running"),
    ]
    (net,) = [r for r in found.resources if r.kind == "private-network"]
    assert net.instance_type == "vmrun-uc" and net.price is None
    assert (found.per_hour, found.currency, found.forgotten) == (4.2, "DKK", ["old"])
    assert render(found, as_json=False) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[-1] == "DKK/H" and "old (forgotten?)" in out
    assert "billing: 2 instance(s) running: 4.20 DKK/h" in out


def test_clusters_refuses_awss_flags_for_ucloud_before_asking_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import error_in

    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_UCLOUD_TOKEN", raising=False)
    assert run(["cloud", "--cloud", "ucloud", "--region", "eu-west-1"]) == 2
    assert error_in(capsys.readouterr().err)[0] == "flags-conflict"
    assert run(["cloud", "--cloud", "gcp"]) == 2
    assert "aws or ucloud" in capsys.readouterr().err


@pytest.mark.parametrize("asked", [{"autostop": "30m"}, {"max_cost": 10.0}])
def test_autostop_and_a_clusters_cap_are_refused_on_ucloud(
    tmp_path: Path, asked: dict[str, object]
) -> None:
    """A guest that powers itself off is booted again by UCloud (KubeVirt's RunStrategy
    Always) and its job stays charged: refused before anything is asked of UCloud."""
    from vmrun.config import load_settings
    from vmrun.operations import cloud

    settings = load_settings({}, cwd=tmp_path, environ={})
    ask = cloud.UpAsk("uc", cloud="ucloud", instance_type="u1-standard-2", count=1, **asked)  # type: ignore[arg-type]
    with pytest.raises(UsageError) as refused:
        cloud.resolve(ask, settings)
    assert refused.value.code == "flags-conflict" and "boots a guest" in refused.value.message


def test_a_cluster_of_several_vms_is_joined_by_one_private_network_that_down_removes() -> None:
    """UCloud's VM jobs reach only themselves: `up -n 2` makes one private network (subdomain
    from the cluster's name), each job joins it with its hostname, which is the node's
    private address; a replacement joins it too; `down` removes jobs, network and key."""
    fake = FakeUCloud(
        boot=lambda job: ("ucloud", "gateway.ucloud.test", 2200 + int(job["id"]) % 100)
    )
    cloud = provider(fake)
    out = Recorder()
    made = cloud.launch(request(), cloud.offer(request()), out)
    (net_id,) = fake.networks
    spec = fake.networks[net_id]["specification"]
    assert (spec["name"], spec["subdomain"], spec["product"]["id"]) == (
        "vmrun-uc",
        "vmrun-uc",
        "private-network",
    )
    jobs = [fake.jobs[i.id]["specification"] for i in made]
    assert [j["hostname"] for j in jobs] == ["uc-0", "uc-1"]
    assert all(j["resources"] == [{"type": "private_network", "id": net_id}] for j in jobs)
    # the SSH line is the shared gateway's: peers meet at the private names instead
    assert [(i.public_addr, i.private_addr) for i in made] == [
        ("gateway.ucloud.test", "uc-0"),
        ("gateway.ucloud.test", "uc-1"),
    ]
    assert any("private network vmrun-uc" in line for line in out.lines), out.lines
    assert fake.calls.count(("GET", "/api/private-networks/retrieveProducts")) == 1
    cloud.terminate_ids("", [made[1].id])  # a lost node, and the VM made in its place
    again = cloud.add(request(count=1), cloud.offer(request(count=1)), 1, Recorder())
    assert fake.jobs[again.id]["specification"]["resources"][0]["id"] == net_id
    assert again.private_addr == "uc-1"
    single = cloud.launch(
        replace(request(count=1), cluster="one"), cloud.offer(request(count=1)), Recorder()
    )
    assert "hostname" not in fake.jobs[single[0].id]["specification"] and len(fake.networks) == 1
    assert single[0].private_addr == single[0].public_addr  # alone: no network, none needed
    gone = cloud.terminate("uc", "")
    assert gone.networks == [net_id] and fake.networks == {} and gone.left == []
    assert gone.keys and fake.keys == []  # the key vmrun added for uc
    assert fake.live() == [single[0].id]


def test_a_taken_subdomain_gets_a_suffix_and_a_failed_up_leaves_no_network() -> None:
    fake = FakeUCloud(announce_ssh=False)
    fake.networks["1"] = {  # another account's, on the same provider
        "id": "1",
        "specification": {"name": "theirs", "subdomain": "VMRUN-UC"},
    }
    cloud = provider(fake, ssh_timeout=0.2)
    with pytest.raises(CloudError) as never:
        cloud.launch(request(), cloud.offer(request()), Recorder())
    assert never.value.code == "cloud-ssh-never-up"
    assert fake.live() == [] and list(fake.networks) == ["1"]  # ours made, then deleted
    assert fake.keys == []  # the key this `up` added, removed with it
    made = [c for c in fake.calls if c == ("POST", "/api/private-networks")]
    assert len(made) == 2  # 409 for vmrun-uc, then vmrun-uc-XXXX
    for taken in ("vm", "j-7", "policy", "ucloud-x"):  # UCloud's reserved subdomains
        assert (
            fake.handle(
                "POST",
                "/api/private-networks",
                {},
                {"Authorization": f"Bearer {API_TOKEN}"},
                {"items": [{"name": "n", "subdomain": taken, "product": {"provider": "ucloud"}}]},
            )[0]
            == 400
        )
    assert all(not subdomain_for(c).startswith(("vm-", "j-")) for c in ("vm", "j", "im"))


def test_several_vms_where_no_private_network_is_offered_are_refused_before_anything() -> None:
    fake = FakeUCloud(network_products=())
    cloud = provider(fake)
    with pytest.raises(UsageError) as refused:
        cloud.offer(request())
    assert refused.value.code == "cloud-no-private-network" and "-n 2" in refused.value.message
    assert fake.jobs == {} and fake.keys == [] and fake.networks == {}
    cloud.launch(request(count=1), cloud.offer(request(count=1)), Recorder())  # one VM: fine
    assert len(fake.live()) == 1


class Interrupting(Recorder):
    """A Ctrl-C while the jobs queue."""

    def info(self, text: str) -> None:
        super().info(text)
        if "is queued at UCloud" in text:
            raise KeyboardInterrupt


def test_an_interrupted_up_leaves_no_job_network_or_key() -> None:
    fake = FakeUCloud(queue_polls=5)
    cloud = provider(fake)
    with pytest.raises(KeyboardInterrupt):
        cloud.launch(request(), cloud.offer(request()), Interrupting())
    assert fake.jobs and fake.live() == []
    assert (fake.networks, fake.keys) == ({}, [])
