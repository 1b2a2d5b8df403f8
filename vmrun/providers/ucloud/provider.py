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
- regions are UCloud's providers (`ucloud`, `aau`...): where the product is.
"""

from __future__ import annotations

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
        self._register_key(request.public_key, request.cluster, out)
        made: list[str] = []
        try:
            for index in range(request.count):
                made.append(self._create(request, offer, index, out))
            return self._wait_ssh(request.cluster, made, out, request.boot_timeout)
        except BaseException:
            if made:
                self.terminate_ids(offer.region, made)
            raise

    def add(self, request: Request, offer: Offer, index: int, out: Reporter) -> Instance:
        self._register_key(request.public_key, request.cluster, out)
        made = self._create(request, offer, index, out)
        try:
            (inst,) = self._wait_ssh(request.cluster, [made], out, request.boot_timeout)
            return inst
        except BaseException:
            self.terminate_ids(offer.region, [made])
            raise

    def _register_key(self, key: str, cluster: str, out: Reporter) -> None:
        """The user's public key among the account's SSH keys (UCloud puts them into each
        VM it starts); added once, found by its text."""
        if not key:
            raise UsageError("UCloud VMs take the user's public key: none was found", code="usage")
        words = key.split()[:2]
        for item in self._pages("/api/ssh/browse", {}):
            if ((item.get("specification") or {}).get("key") or "").split()[:2] == words:
                return
        item = {"title": f"vmrun {cluster}", "key": key.strip()}
        self.session.call("POST", "/api/ssh", {"items": [item]}, what="adding your SSH key")
        out.info("ucloud: your public key added to the account's SSH keys (every VM gets it)")

    def _create(self, request: Request, offer: Offer, index: int, out: Reporter) -> str:
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
        return Instance(
            id=str(job.get("id") or ""),
            cluster=str(labels.get(TAG_CLUSTER) or ""),
            state=_STATES.get(ucjobs.state_of(job), "pending"),
            instance_type=str(product.get("id") or ""),
            zone="",
            region=str(product.get("provider") or ""),
            public_addr=at.host if at else "",
            private_addr=at.host if at else "",
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
        ids = [i.id for i in self.describe(cluster, region)]
        self.terminate_ids(region, ids)
        left = [i.id for i in self.describe(cluster, region)]
        return Removed(instances=ids, left=[f"job {i} (still running)" for i in left])

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
        found = []
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


def _app(image: str) -> tuple[str, str]:
    """The VM application: `NAME/VERSION` as given, else UCloud's Ubuntu VM."""
    if "/" in image:
        name, version = image.split("/", 1)
        return name, version
    return DEFAULT_APP


def _last_words(job: Mapping[str, Any]) -> str:
    updates = [u for u in job.get("updates") or [] if (u or {}).get("status")]
    return str(updates[-1]["status"]).splitlines()[-1][:200] if updates else "no word from UCloud"
