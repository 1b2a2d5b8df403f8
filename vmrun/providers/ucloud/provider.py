"""UCloud behind the provider seam: a cluster is one UCloud job of the VM application per
node, labelled `vmrun-cluster: NAME` (and `vmrun-index`), as `vmrun up` asks.

What differs from a cloud of instances, and how vmrun meets it:

- no user data: the user's public key is registered as one of the account's SSH keys
  (`/api/ssh`), which UCloud's provider installs in every VM it starts; and no host key can
  be handed in, so the caller pins the key it first sees (`gives_host_key` is False);
- no address field: the SSH login is read from the job's updates (vmrun.providers.ucloud
  .jobs.ssh_at); a job that runs but never announces one is terminated and refused;
- no expiry (UCloud drops a VM job's time allocation): `down` is the only end; stop and
  start are UCloud's suspend and unsuspend;
- regions are UCloud's providers (`ucloud`, `aau`...): where the product is;
- VM jobs do not reach each other (each job's NetworkPolicy admits only itself; the SSH
  line is a shared gateway's port): a cluster of several VMs gets one private network
  (`vmrun-NAME`), every job joins it with a hostname of its own (`NAME-0`...) that is its
  `private_addr`, and `down` deletes the network after the jobs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from vmrun.errors import CloudError, Interrupted, UsageError
from vmrun.providers.api import (
    TAG_CLUSTER,
    TAG_CREATED,
    TAG_CREATOR,
    Instance,
    Offer,
    Removed,
    Request,
    Resource,
)
from vmrun.providers.ucloud import jobs as ucjobs
from vmrun.providers.ucloud.session import Session
from vmrun.reporting import QUIET, Reporter

DEFAULT_APP = ("vm-ubuntu", "24.04")  # UCloud's VM image application (ucxsvc VmImageUbuntu24_04)
LOGIN_USER = "ucloud"
TAG_INDEX = "vmrun-index"
NETWORK_CATEGORY = "private-network"  # the free product VM jobs are joined with
# subdomains the provider keeps for itself, alone or before a `-` (k8s/shared/private_network.go)
RESERVED_SUBDOMAINS = ("j", "ucloud", "vm", "im", "policy")
NETWORK_END_S = 120.0  # how long `down` waits for the jobs to leave the network
POLL_S = 2.0
SSH_LINE_TIMEOUT_S = 600.0
_LIVE = ("pending", "running", "stopping", "stopped")
_STATES = {
    ucjobs.IN_QUEUE: "pending",
    ucjobs.RUNNING: "running",
    ucjobs.SUSPENDED: "stopped",
    **dict.fromkeys(ucjobs.ENDED, "terminated"),
}


@dataclass(frozen=True)
class Product:
    name: str
    category: str
    provider: str
    price: ucjobs.Price | None
    gpus: int = 0


class UCloudProvider:
    name = "ucloud"
    gives_host_key = False  # no user data: the first key seen is pinned
    needs_ssh_cidr = False  # UCloud's provider decides who reaches port 22

    def __init__(
        self,
        session: Session | None = None,
        *,
        poll: float = POLL_S,
        ssh_timeout: float = SSH_LINE_TIMEOUT_S,
    ) -> None:
        self._session = session
        self.poll = poll
        self.ssh_timeout = ssh_timeout
        self._products: list[Product] | None = None
        self._network_products: Mapping[str, Any] | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session.from_environment()
        return self._session

    @property
    def default_region(self) -> str:
        return ""  # where the product is

    def check_credentials(self) -> None:
        self.session  # noqa: B018  # refuses without a token, before any call

    # -- products ----------------------------------------------------------------------

    def products(self) -> list[Product]:
        """The machine types that run VMs (jobs.retrieveProducts' support says which)."""
        if self._products is None:
            found = self.session.call(
                "GET", "/api/jobs/retrieveProducts", what="listing the machine types"
            )
            products = []
            for provider, items in (found or {}).get("productsByProvider", {}).items():
                for item in items or []:
                    vm = ((item.get("support") or {}).get("virtualMachine") or {}).get("enabled")
                    product = item.get("product") or {}
                    if vm and product.get("name"):
                        category = product.get("category") or {}
                        products.append(
                            Product(
                                product["name"],
                                str(category.get("name") or ""),
                                str(category.get("provider") or provider),
                                ucjobs.price_of(product),
                                int(product.get("gpu") or 0),
                            )
                        )
            self._products = products
        return self._products

    def product(self, name: str, region: str = "") -> Product:
        found = [p for p in self.products() if p.name == name and region in ("", p.provider)]
        if not found:
            known = sorted({p.name for p in self.products()})
            raise UsageError(
                f"--type {name}: UCloud offers no VM of that type"
                + (f" at {region}" if region else ""),
                hint=f"VM types here: {', '.join(known[:12]) or 'none'}",
                code="cloud-type-not-offered",
            )
        return found[0]

    def offer(self, request: Request) -> Offer:
        product = self.product(request.instance_type, request.region)
        if request.count > 1 and not self._network_product(product.provider):
            raise UsageError(
                f"-n {request.count}: UCloud's {product.provider} offers no private network,"
                " and its VMs reach only themselves without one",
                hint="ask for one VM, or for a grant of the private-network product at"
                f" {product.provider}",
                code="cloud-no-private-network",
            )
        name, version = _app(request.image)
        return Offer(
            region=product.provider,
            image_id=f"{name}/{version}",
            image_name=f"{name} {version}",
            user=request.user or LOGIN_USER,
            zones=[],
            placement=False,
        )

    # -- making and finding ------------------------------------------------------------

    def launch(self, request: Request, offer: Offer, out: Reporter) -> list[Instance]:
        key = self._register_key(request.public_key, request.cluster, out)
        made: list[str] = []
        network = ""
        try:
            if request.count > 1:
                network = self._make_network(request.cluster, offer.region, out)
            for index in range(request.count):
                made.append(self._create(request, offer, index, out, network))
            return self._wait_ssh(request.cluster, made, out, request.boot_timeout)
        except BaseException:
            if made:
                self.terminate_ids(offer.region, made)
            if network:
                self._delete_network(network, made)
            if key:  # added for this `up`: nothing of it stays
                self._delete_keys([key])
            raise

    def add(self, request: Request, offer: Offer, index: int, out: Reporter) -> Instance:
        """A VM in place of a lost one: it joins the cluster's network, if it has one."""
        self._register_key(request.public_key, request.cluster, out)
        found = self._networks(request.cluster)
        made = self._create(request, offer, index, out, str(found[0].get("id")) if found else "")
        try:
            (inst,) = self._wait_ssh(request.cluster, [made], out, request.boot_timeout)
            return inst
        except BaseException:
            self.terminate_ids(offer.region, [made])
            raise

    # -- the cluster's private network -------------------------------------------------

    def _network_product(self, provider: str) -> Mapping[str, Any] | None:
        """The private-network product at `provider` (retrieveProducts), None without one."""
        if self._network_products is None:  # asked once: `offer` and `launch` both read it
            found = self.session.call(
                "GET", "/api/private-networks/retrieveProducts", what="listing private networks"
            )
            self._network_products = (found or {}).get("productsByProvider") or {}
        for item in self._network_products.get(provider) or []:
            product = (item or {}).get("product") or {}
            if product.get("name"):
                return {
                    "id": product["name"],
                    "category": str(
                        (product.get("category") or {}).get("name") or NETWORK_CATEGORY
                    ),
                    "provider": provider,
                }
        return None

    def _make_network(self, cluster: str, provider: str, out: Reporter) -> str:
        """One private network for the cluster; its subdomain `vmrun-NAME`, with a suffix
        when another account holds that one (subdomains are unique per provider)."""
        product = self._network_product(provider)
        if product is None:  # offer() refused this already
            raise UsageError(
                f"UCloud's {provider} offers no private network", code="cloud-no-private-network"
            )
        for attempt in range(4):
            subdomain = subdomain_for(cluster, attempt)
            spec = {"name": network_name(cluster), "subdomain": subdomain, "product": product}
            try:
                answer = self.session.call(
                    "POST",
                    "/api/private-networks",
                    {"items": [spec]},
                    what=f"making the private network of {cluster}",
                )
            except CloudError as error:
                if "409" in error.message and attempt < 3:  # the subdomain is taken
                    continue
                raise
            made = str(((answer or {}).get("responses") or [{}])[0].get("id") or "")
            if not made:
                raise CloudError(
                    f"UCloud made no private network for {cluster}", code="cloud-failed"
                )
            out.info(f"{cluster}: private network {subdomain} ({made}) joins its VMs")
            return made
        raise AssertionError("unreachable")

    def _networks(self, cluster: str | None) -> list[Mapping[str, Any]]:
        """The private networks vmrun made (for `cluster`, or every one), by their name."""

        def named(network: Mapping[str, Any]) -> str:
            return str((network.get("specification") or {}).get("name") or "")

        found = self._pages("/api/private-networks/browse", {})
        if cluster is None:
            return [n for n in found if named(n).startswith(NETWORK_PREFIX)]
        return [n for n in found if named(n) == network_name(cluster)]

    def _delete_network(self, network: str, jobs: list[str]) -> bool:
        """Delete the network once `jobs` have left it (UCloud refuses a network in use);
        False when it is still there past the wait."""
        deadline = time.monotonic() + NETWORK_END_S
        while True:
            live = [j for j in jobs if ucjobs.state_of(self._job(j)) not in ucjobs.ENDED]
            if not live:
                try:
                    self.session.call(
                        "DELETE",
                        "/api/private-networks",
                        {"items": [{"id": network}]},
                        what=f"deleting private network {network}",
                    )
                    return True
                except CloudError:
                    if time.monotonic() > deadline:
                        return False
            elif time.monotonic() > deadline:
                return False
            time.sleep(self.poll)

    def _register_key(self, key: str, cluster: str, out: Reporter) -> str:
        """The user's public key among the account's SSH keys (UCloud puts them into each
        VM it starts); added once, found by its text. The id of the key added, "" when it
        was there already."""
        if not key:
            raise UsageError("UCloud VMs take the user's public key: none was found", code="usage")
        words = key.split()[:2]
        for item in self._pages("/api/ssh/browse", {}):
            if ((item.get("specification") or {}).get("key") or "").split()[:2] == words:
                return ""
        item = {"title": f"vmrun {cluster}", "key": key.strip()}
        answer = self.session.call(
            "POST", "/api/ssh", {"items": [item]}, what="adding your SSH key"
        )
        out.info("ucloud: your public key added to the account's SSH keys (every VM gets it)")
        return str(((answer or {}).get("responses") or [{}])[0].get("id") or "")

    def _delete_keys(self, keys: list[str]) -> None:
        self.session.call(
            "DELETE",
            "/api/ssh",
            {"items": [{"id": k} for k in keys]},
            what="removing the SSH key vmrun added",
        )

    def _create(
        self, request: Request, offer: Offer, index: int, out: Reporter, network: str = ""
    ) -> str:
        product = self.product(request.instance_type, offer.region)
        name, version = offer.image_id.split("/", 1)
        created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        labels = {
            TAG_CLUSTER: request.cluster,
            TAG_INDEX: str(index),
            TAG_CREATOR: request.creator,
            TAG_CREATED: created,
        }
        spec: dict[str, Any] = {
            "application": {"name": name, "version": version},
            "product": {
                "id": product.name,
                "category": product.category,
                "provider": product.provider,
            },
            "name": f"{request.cluster}-{index}",
            "replicas": 1,
            "sshEnabled": True,
            "labels": labels,
            "parameters": {},
            "resources": [],
        }
        if network:  # reached by its peers as NAME-i, inside the network only
            spec["hostname"] = f"{request.cluster}-{index}"
            spec["resources"] = [{"type": "private_network", "id": network}]
        if request.disk_gb:
            spec["parameters"]["diskSize"] = {"type": "integer", "value": int(request.disk_gb)}
        answer = self.session.call(
            "POST", "/api/jobs", {"items": [spec]}, what=f"starting VM {request.cluster}-{index}"
        )
        job = str(((answer or {}).get("responses") or [{}])[0].get("id") or "")
        if not job:
            raise CloudError(
                f"UCloud started no job for {request.cluster}-{index}", code="cloud-failed"
            )
        out.info(f"{request.cluster}: node {index} job {job} requested ({product.name})")
        return job

    def _wait_ssh(
        self, cluster: str, ids: list[str], out: Reporter, timeout: float | None = None
    ) -> list[Instance]:
        """Until each job runs and has said where SSH is; a job that ends is refused with
        its last words, one that runs without an SSH line past the limit too."""
        limit = min(timeout, self.ssh_timeout) if timeout is not None else self.ssh_timeout
        deadline = time.monotonic() + limit
        told: set[str] = set()
        done: dict[str, Instance] = {}
        while True:
            for job_id in ids:
                if job_id in done:
                    continue
                job = self._job(job_id)
                state = ucjobs.state_of(job)
                if state in ucjobs.ENDED:
                    raise CloudError(
                        f"UCloud job {job_id} of {cluster} ended ({state}) before it ran:"
                        f" {_last_words(job)}",
                        code="cloud-failed",
                    )
                if state == ucjobs.IN_QUEUE and job_id not in told:
                    told.add(job_id)
                    out.info(f"{cluster}: job {job_id} is queued at UCloud ({_last_words(job)})")
                inst = self._instance(job)
                if state == ucjobs.RUNNING and inst.public_addr:
                    done[job_id] = inst
            if len(done) == len(ids):
                return sorted(done.values(), key=lambda i: i.index)
            if time.monotonic() > deadline:
                waiting = [i for i in ids if i not in done]
                raise CloudError(
                    f"UCloud job(s) {', '.join(waiting)} of {cluster} announced no SSH address"
                    f" within {limit:.0f} s (no `ssh ucloud@...` update)",
                    hint="the VM application must have SSH enabled; see the job's page at"
                    " UCloud; the jobs were terminated",
                    code="cloud-ssh-never-up",
                )
            try:
                time.sleep(self.poll)
            except KeyboardInterrupt:
                raise Interrupted("interrupted while the VMs start") from None

    def _job(self, job_id: str) -> Mapping[str, Any]:
        return (
            self.session.call(
                "GET",
                "/api/jobs/retrieve",
                query={"id": job_id, "includeUpdates": True, "includeProduct": True},
                what=f"reading job {job_id}",
            )
            or {}
        )

    def _instance(self, job: Mapping[str, Any]) -> Instance:
        spec = job.get("specification") or {}
        labels = ucjobs.labels_of(job)
        product = spec.get("product") or {}
        at = ucjobs.ssh_at(job) if ucjobs.state_of(job) == ucjobs.RUNNING else None
        created = job.get("createdAt")
        joined = any(
            (r or {}).get("type") == "private_network" for r in spec.get("resources") or []
        )
        private = str(spec.get("hostname") or "") if joined else ""
        return Instance(
            id=str(job.get("id") or ""),
            cluster=str(labels.get(TAG_CLUSTER) or ""),
            state=_STATES.get(ucjobs.state_of(job), "pending"),
            instance_type=str(product.get("id") or ""),
            zone="",
            region=str(product.get("provider") or ""),
            public_addr=at.host if at else "",
            private_addr=private or (at.host if at else ""),
            launched=datetime.fromtimestamp(created / 1000, timezone.utc)
            if isinstance(created, int)
            else None,
            index=int(labels.get(TAG_INDEX) or 0),
            image_id="/".join(
                str((spec.get("application") or {}).get(k) or "") for k in ("name", "version")
            ),
            ssh_port=at.port if at else 22,
            login_user=at.user if at else "",
        )

    def _pages(self, path: str, query: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        items: list[Mapping[str, Any]] = []
        after = None
        for _ in range(100):  # bounded: 100 pages of 250
            page = (
                self.session.call("GET", path, query={**query, "itemsPerPage": 250, "next": after})
                or {}
            )
            items += page.get("items") or []
            after = page.get("next")
            if not after:
                break
        return items

    def _cluster_jobs(self, cluster: str | None) -> list[Mapping[str, Any]]:
        query = {"filterType": "VMS_ONLY", "includeUpdates": True, "includeProduct": True}
        found = [
            j for j in self._pages("/api/jobs/browse", query) if TAG_CLUSTER in ucjobs.labels_of(j)
        ]
        return [j for j in found if cluster is None or ucjobs.labels_of(j)[TAG_CLUSTER] == cluster]

    def describe(
        self, cluster: str, region: str, states: tuple[str, ...] = _LIVE
    ) -> list[Instance]:
        found = [self._instance(j) for j in self._cluster_jobs(cluster)]
        return sorted((i for i in found if i.state in states), key=lambda i: i.index)

    def wait_running(
        self, cluster: str, region: str, ids: list[str], timeout: float
    ) -> list[Instance]:
        return self._wait_ssh(cluster, ids, QUIET, timeout)

    def stop(self, cluster: str, region: str) -> Removed:
        ids = [i.id for i in self.describe(cluster, region, ("pending", "running"))]
        if ids:
            self.session.call(
                "POST",
                "/api/jobs/suspend",
                {"items": [{"id": i} for i in ids]},
                what="suspending the VMs",
            )
        return Removed(instances=ids)

    def start(self, cluster: str, region: str, out: Reporter) -> list[Instance]:
        ids = [i.id for i in self.describe(cluster, region, ("stopped",))]
        if ids:
            self.session.call(
                "POST",
                "/api/jobs/unsuspend",
                {"items": [{"id": i} for i in ids]},
                what="starting the VMs again",
            )
        every = [i.id for i in self.describe(cluster, region)]
        return self._wait_ssh(cluster, every, out)

    def terminate(self, cluster: str, region: str) -> Removed:
        """The jobs, then the cluster's network once they left it, then the SSH key vmrun
        added for the cluster (a later `up` or replacement adds it again)."""
        ids = [i.id for i in self.describe(cluster, region)]
        self.terminate_ids(region, ids)
        left = [f"job {i.id} (still running)" for i in self.describe(cluster, region)]
        networks = []
        for network in self._networks(cluster):
            net_id = str(network.get("id") or "")
            members = [str(m) for m in (network.get("status") or {}).get("members") or []]
            if self._delete_network(net_id, sorted(set(members) | set(ids))):
                networks.append(net_id)
            else:
                left.append(f"private network {net_id} (still in use)")
        keys = [
            str(k.get("id"))
            for k in self._pages("/api/ssh/browse", {})
            if (k.get("specification") or {}).get("title") == f"vmrun {cluster}"
        ]
        if keys:
            self._delete_keys(keys)
        return Removed(instances=ids, networks=networks, keys=keys, left=left)

    def terminate_ids(self, region: str, ids: list[str]) -> list[str]:
        if ids:
            self.session.call(
                "POST",
                "/api/jobs/terminate",
                {"items": [{"id": i} for i in ids]},
                what="terminating the VMs",
            )
        return ids

    def resources(self, regions: list[str]) -> list[Resource]:
        found = [network_resource(n) for n in self._networks(None)]
        for job in self._cluster_jobs(None):
            inst = self._instance(job)
            if inst.state == "terminated":
                continue
            labels = ucjobs.labels_of(job)
            found.append(
                Resource(
                    kind="instance",
                    id=inst.id,
                    cluster=inst.cluster,
                    region=inst.region,
                    state=inst.state,
                    instance_type=inst.instance_type,
                    created=inst.launched,
                    creator=str(labels.get(TAG_CREATOR) or ""),
                )
            )
        return found

    def hourly_price(self, instance: Instance) -> float | None:
        """The product's price an hour, where its unit is money (DKK on UCloud's own
        providers); None for core-hours and the like, which no run's cost can add up."""
        price = self._price(instance)
        return price.per_hour if price is not None else None

    def price_currency(self, instance: Instance) -> str:
        price = self._price(instance)
        return price.unit if price is not None else ""

    def _price(self, instance: Instance) -> ucjobs.Price | None:
        found = [
            p
            for p in self.products()
            if p.name == instance.instance_type and instance.region in ("", p.provider)
        ]
        price = found[0].price if found else None
        unit = price.unit if price is not None else ""
        currency = len(unit) == 3 and unit.isascii() and unit.isupper()
        return price if currency else None

    def host_key(self, instance: Instance) -> str:
        return ""

    def user_data(self, instance: Instance) -> str:
        return ""


NETWORK_PREFIX = "vmrun-"


def network_resource(network: Mapping[str, Any]) -> Resource:
    """A cluster's private network as `vmrun cloud` lists it: its subdomain where a VM's
    type goes, how many VMs are in it where a state goes (it costs nothing)."""
    spec = network.get("specification") or {}
    members = (network.get("status") or {}).get("members") or []
    return Resource(
        kind="private-network",
        id=str(network.get("id") or ""),
        cluster=str(spec.get("name") or "")[len(NETWORK_PREFIX) :],
        region=str((spec.get("product") or {}).get("provider") or ""),
        state=f"{len(members)}-vm(s)",
        instance_type=str(spec.get("subdomain") or ""),
    )


def network_name(cluster: str) -> str:
    return f"{NETWORK_PREFIX}{cluster}"


def subdomain_for(cluster: str, attempt: int = 0) -> str:
    """A DNS label from the cluster's name (vmrun's names are lower case, digits and -),
    clear of UCloud's reserved ones; a suffix on later attempts (another holds it)."""
    label = network_name(cluster)
    if attempt:
        label = f"{label}-{secrets.token_hex(2)}"
    label = label[:63].rstrip("-")
    assert not any(label == r or label.startswith(r + "-") for r in RESERVED_SUBDOMAINS)
    return label


def _app(image: str) -> tuple[str, str]:
    """The VM application: `NAME/VERSION` as given, else UCloud's Ubuntu VM."""
    if "/" in image:
        name, version = image.split("/", 1)
        return name, version
    return DEFAULT_APP


def _last_words(job: Mapping[str, Any]) -> str:
    updates = [u for u in job.get("updates") or [] if (u or {}).get("status")]
    return str(updates[-1]["status"]).splitlines()[-1][:200] if updates else "no word from UCloud"
