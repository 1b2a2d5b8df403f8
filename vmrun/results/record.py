"""A run's record (run.json) as one typed, versioned value, whichever place ran it.

SSH hosts, a Slurm cluster and `train --local` each wrote their own run.json; older vmruns
wrote older variants of each. `RunRecord.from_json` reads every one of those forms here, in
one place (a field of the wrong type reads as unknown, never as an error: a record outlives
the vmrun that wrote it), and `to_json` writes the current schema. The keys each place wrote
keep their names and meanings: the host scripts of older vmruns read `metrics` (their
slurm_runs.sh), `python`, `out_dir`, `ran_before_s`, `price_per_hour` and `currency` (this
vmrun's get them from the launch spec, notify.json and a Slurm record's metrics.path).
Keys this vmrun does not know (a newer one's) are kept in `extra` and written back as they
were.

The fields are the schema `status --json` and `report --json` give as `record`
(docs/reports.md lists them; a test keeps that list and these fields alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vmrun.containers.request import Request

SCHEMA = 2  # 1: the untyped forms before it (no `schema` key)
HOSTS, CLUSTER, LOCAL = "hosts", "cluster", "local"


# -- lenient readers: a field of the wrong type is unknown ---------------------------------


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _opt_str(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _opt_strs(value: Any) -> tuple[str, ...] | None:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else None


def _map(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _maps(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(dict(v) for v in value if isinstance(v, Mapping))


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """A key written only where the record knows it (null and empty are not written)."""
    if value is None or (isinstance(value, str | tuple | list | dict) and not value):
        return
    out[key] = list(value) if isinstance(value, tuple) else value


# -- the groups ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    """The container a run ran in (`--image`): as asked, and what the host resolved."""

    image: str
    mounts: tuple[str, ...] = ()  # SOURCE:TARGET[:ro]
    runtime: str = "auto"  # docker, podman, pyxis, apptainer, ...
    ulimits: tuple[str, ...] = ()
    pull: str = "newer"
    digest: str | None = None  # the image's digest on the host, where it was resolved
    image_id: str | None = None  # the image's ID on the host (its config's digest)
    resolved: bool = False  # the host resolved it (`digest` and `image_id` written, null or not)

    KEYS = ("image", "mounts", "container_runtime", "container_ulimits", "pull")
    RESOLVED = ("image_digest", "image_id")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Image | None:
        image = _str(raw.get("image"))
        if not image:
            return None
        return cls(
            image=image,
            mounts=_strs(raw.get("mounts")),
            runtime=_str(raw.get("container_runtime"), "auto") or "auto",
            ulimits=_strs(raw.get("container_ulimits")),
            pull=_str(raw.get("pull"), "newer") or "newer",
            digest=_opt_str(raw.get("image_digest")),
            image_id=_opt_str(raw.get("image_id")),
            resolved=any(k in raw for k in cls.RESOLVED),
        )

    def request(self) -> Request:
        """The request as the run made it, to make it again (`--resume`)."""
        from vmrun.containers.image import parse_image, parse_mount
        from vmrun.containers.request import Request, check_pull

        return Request(
            parse_image(self.image),
            tuple(parse_mount(m) for m in self.mounts),
            self.runtime,
            self.ulimits,
            check_pull(self.pull),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "image": self.image,
            "mounts": list(self.mounts),
            "container_runtime": self.runtime,
            "container_ulimits": list(self.ulimits),
            "pull": self.pull,
        }
        if self.resolved:
            out.update(image_digest=self.digest, image_id=self.image_id)
        return out


@dataclass(frozen=True)
class Launch:
    """What was started and how: the same for every node of a run, but `argv`, `ifname`,
    `workdir`, `out_dir`, `python` and `variables`, which are the node's."""

    name: str = ""  # the run's name (its id's prefix)
    template: bool | None = None  # the bundled trainer (None: not recorded, a batch script)
    launcher: str = ""  # torchrun, env, python; sbatch for a user's own batch script
    script: str = ""  # the script, as the place names it
    args: tuple[str, ...] | None = None  # the script's own arguments (None: not recorded)
    argv: tuple[str, ...] = ()  # the command the node ran
    python: str = ""  # the interpreter that ran it (hostside scripts read it)
    workdir: str = ""  # the node's copy of the project (hosts)
    out_dir: str = ""  # where its outputs go (hostside scripts read it)
    nproc_requested: str | None = None  # --nproc-per-node as asked (None: the default)
    nproc: str | None = None  # processes per node as resolved: a number, `gpu`, `cpu`
    nnodes: str | None = None  # torchrun's --nnodes (`2`, `1:4`)
    rdzv: str | None = None  # the rendezvous endpoint of a multi-node run
    ifname: str = ""  # the network interface NCCL was told to use on this node
    env_keys: tuple[str, ...] | None = None  # --env names (never their values)
    variables: Mapping[str, str | None] | None = None  # vmrun's variables; the user's: names
    max_restarts: int | None = None  # torchrun's --max-restarts
    image: Image | None = None  # the container it ran in
    data: tuple[Mapping[str, Any], ...] = ()  # --data: where each went and what it held


@dataclass(frozen=True)
class Policy:
    """What the run was told to do when things go wrong."""

    recover: bool = False  # --recover
    max_recoveries: int | None = None  # a cluster job's --recover N
    hang_timeout: int | None = None  # --hang-timeout seconds (None: not watched)
    on_hang: str | None = None  # what a hang does: wait, stop, restart
    max_cost: float | None = None  # --max-cost, in the prices' currency


@dataclass(frozen=True)
class Prices:
    """The nodes' prices an hour as the run started (vmrun.results.cost.prices)."""

    by_node: Mapping[str, float]
    per_hour: float  # their sum: the run's price an hour
    currency: str = "USD"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prices | None:
        per_hour = raw.get("price_per_hour")
        if isinstance(per_hour, bool) or not isinstance(per_hour, int | float):
            return None
        listed = _map(raw.get("prices")) or {}
        by_node = {
            str(k): float(v)
            for k, v in listed.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return cls(by_node, per_hour, _str(raw.get("currency"), "USD") or "USD")


@dataclass(frozen=True)
class Job:
    """A cluster's job: what was asked of Slurm and where its files are."""

    nodes: int | None = None  # --nodes
    tasks_per_node: int | None = None
    nproc_per_node: int | None = None  # processes per node (None: the script's own count)
    world_size: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    max_requeues: int | None = None
    epochs: int | None = None  # the template's epochs
    submitted: float | None = None  # this machine's clock at submission
    record_dir: str = ""  # the run's record on the cluster: job.sh, run.json, job.log, ...
    code_dir: str = ""
    metrics: str = ""  # the run's metrics file (also the record's metrics.path)
    batch_script: bool = False  # the user's own batch script (`vmrun submit`)
    sbatch: tuple[str, ...] = ()  # its sbatch words
    job_name: str | None = None
    array: str | None = None  # its --array
    output: str | None = None  # its --output, --error and work dir
    error: str | None = None
    work_dir: str = ""
    # what the cluster's listing adds (never in run.json as written at submission)
    job_id: str = ""
    since: float | None = None  # the cluster's clock at submission (a batch script's)
    files_on: str = ""  # the node its files are on (a cluster without a shared folder)


@dataclass(frozen=True)
class LocalEnd:
    """How a `train --local` run went, as it rewrites its record."""

    status: str = ""  # running, finished, failed, stopped, error
    cwd: str = ""  # the project
    run_dir: str = ""  # its results/<run-id>
    pid: int | None = None
    start_time: str | None = None  # ISO 8601
    end_time: str | None = None
    exit_code: int | None = None
    error: str | None = None  # vmrun's own failure, where it had one


# -- the record ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRecord:
    """One run's record (one node's, on hosts: all nodes share it but for `host`, `launch`'s
    node facts and `started`)."""

    run_id: str = ""
    where: str = ""  # HOSTS, CLUSTER, LOCAL; "" for no record
    schema: int = SCHEMA  # the form it was read from (1: before schemas)
    hosts: tuple[str, ...] = ()  # a hosts run's nodes, master (rank 0) first
    master: str = ""
    host: str = ""  # the node this record is of
    cluster: str = ""
    launch: Launch = field(default_factory=Launch)
    code: Mapping[str, Any] | None = None  # vmrun.runs.provenance's facts: commit, dirty, ...
    code_earlier: tuple[Mapping[str, Any], ...] = ()  # a resumed run's earlier attempts' code
    store: str | None = None  # the bucket a --store run is copied to
    store_node: str = ""  # the node that copies it
    policy: Policy = field(default_factory=Policy)
    prices: Prices | None = None
    ran_before_s: float = 0.0  # a resumed run's earlier attempts ran this long, in all
    started: float | None = None  # a hosts run: this machine's clock at this attempt's start
    job: Job | None = None  # a cluster run's job
    local: LocalEnd | None = None  # a --local run's end
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a newer vmrun wrote

    # -- reading ----------------------------------------------------------------------------

    @classmethod
    def from_json(cls, raw: Any) -> RunRecord:
        """Any form of run.json (an empty or unreadable one: `where` "")."""
        if not isinstance(raw, Mapping) or not raw:
            return cls(schema=0)
        told = raw.get("where")
        where = told if isinstance(told, str) and told in (HOSTS, CLUSTER, LOCAL) else _where(raw)
        hosts = _strs(raw.get("nodes")) if where == HOSTS else ()
        if where == HOSTS and not hosts and _str(raw.get("host")):
            hosts = (str(raw["host"]),)  # an older single-host record
        return cls(
            run_id=_str(raw.get("id")) or _str(raw.get("run_id")),
            where=where,
            schema=_opt_int(raw.get("schema")) or 1,
            hosts=hosts,
            master=_str(raw.get("master")),
            host=_str(raw.get("host")),
            cluster=_str(raw.get("cluster")),
            launch=_launch(raw),
            code=_map(raw.get("code")),
            code_earlier=_maps(raw.get("code_earlier")),
            store=_str(raw.get("store")) or None,
            store_node=_str(raw.get("store_node")),
            policy=Policy(
                recover=bool(raw.get("recover")),
                max_recoveries=_opt_int(raw.get("max_recoveries")),
                hang_timeout=_opt_int(raw.get("hang_timeout")),
                on_hang=_opt_str(raw.get("on_hang")),
                max_cost=_opt_float(raw.get("max_cost")),
            ),
            prices=Prices.from_json(raw),
            ran_before_s=_opt_float(raw.get("ran_before_s")) or 0.0,
            started=_opt_float(raw.get("started")) if where != LOCAL else None,
            job=_job(raw) if where == CLUSTER else None,
            local=_local(raw) if where == LOCAL else None,
            extra={k: v for k, v in raw.items() if k not in _KNOWN},
        )

    # -- writing ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The current schema: each place's keys as it always wrote them, and `schema`."""
        out: dict[str, Any] = {"schema": SCHEMA}
        _put(out, "where", self.where)
        _put(out, "run_id" if self.where == CLUSTER else "id", self.run_id)
        launch = self.launch
        _put(out, "name", launch.name)
        _put(out, "template", launch.template)
        _put(out, "launcher", launch.launcher)
        _put(out, "script", launch.script)
        if launch.args is not None:
            out["args"] = list(launch.args)
        out.update(self._place_json())
        _put(out, "max_restarts", launch.max_restarts)
        _put(out, "variables", None if launch.variables is None else dict(launch.variables))
        if launch.variables == {}:
            out["variables"] = {}
        out.update(launch.image.to_json() if launch.image else {})
        _put(out, "data", [dict(d) for d in launch.data])
        _put(out, "code", None if self.code is None else dict(self.code))
        _put(out, "code_earlier", [dict(c) for c in self.code_earlier])
        _put(out, "ran_before_s", round(self.ran_before_s, 1) or None)
        if self.store:
            out.update(store=self.store, store_node=self.store_node)
        out.update(self._policy_json())
        _put(out, "started", self.started)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def _place_json(self) -> dict[str, Any]:
        """The keys only one place writes, as it names them."""
        launch = self.launch
        if self.where == HOSTS:
            return {
                "nodes": list(self.hosts),
                "master": self.master,
                "host": self.host,
                "nproc_requested": launch.nproc_requested,
                "nproc": launch.nproc,
                "nnodes": launch.nnodes,
                "rdzv": launch.rdzv,
                "ifname": launch.ifname,
                "argv": list(launch.argv),
                "workdir": launch.workdir,
                "out_dir": launch.out_dir,
                "python": launch.python,
                "env_keys": list(launch.env_keys or ()),
            }
        if self.where == LOCAL:
            end = self.local or LocalEnd()
            out: dict[str, Any] = {
                "status": end.status,
                "nproc": launch.nproc,
                "argv": list(launch.argv),
                "cwd": end.cwd,
                "run_dir": end.run_dir,
                "env_keys": list(launch.env_keys or ()),
                "python": launch.python,
                "pid": end.pid,
                "start_time": end.start_time,
                "end_time": end.end_time,
                "exit_code": end.exit_code,
            }
            _put(out, "error", end.error)
            return out
        out = {}
        _put(out, "cluster", self.cluster)
        for key in ("nproc", "argv", "python", "workdir", "env_keys"):
            _put(out, key, getattr(launch, key))
        if self.where == CLUSTER:
            out.update(_job_json(self.job or Job()))
        _put(out, "out_dir", launch.out_dir)
        return out

    def _policy_json(self) -> dict[str, Any]:
        policy, out = self.policy, dict[str, Any]()
        _put(out, "recover", policy.recover or None)
        _put(out, "max_recoveries", policy.max_recoveries)
        if policy.hang_timeout:
            out.update(hang_timeout=policy.hang_timeout, on_hang=policy.on_hang)
        _put(out, "max_cost", policy.max_cost)
        if self.prices is not None:
            out["prices"] = dict(self.prices.by_node)
            out["price_per_hour"] = self.prices.per_hour
            out["currency"] = self.prices.currency
        return out

    # -- what readers ask -------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        """The typed fields as JSON (`record` in `status --json` and `report --json`): the
        same names in every run's, whichever place ran it; null where unknown."""
        return json_safe(asdict(self))

    def __bool__(self) -> bool:
        """False for no record (an empty or unreadable run.json)."""
        return bool(self.where)

    @property
    def price_per_hour(self) -> float | None:
        return self.prices.per_hour if self.prices else None

    @property
    def currency(self) -> str:
        return self.prices.currency if self.prices else "USD"

    @property
    def image(self) -> str:
        return self.launch.image.image if self.launch.image else ""

    @property
    def template(self) -> bool:
        """The bundled trainer; a record that does not say counts as one (older hosts')."""
        return self.launch.template is not False

    @property
    def epochs_asked(self) -> int | None:
        """The template's epoch count (its first argument); a SCRIPT's own count is unknown."""
        if self.job is not None and self.job.epochs:
            return self.job.epochs if self.job.epochs > 0 else None
        if not self.launch.template:
            return None
        args = self.launch.args
        if args is None:  # an older --local record: the script's arguments in argv
            argv, script = self.launch.argv, self.launch.script
            if script not in argv:
                return None
            args = argv[argv.index(script) + 1 :]
        first = args[0] if args else ""
        return int(first) or None if first.strip().isdigit() else None

    def with_job(self, **facts: Any) -> RunRecord:
        """The record with what the cluster's listing knows of its job (`job_id`, ...)."""
        return replace(self, job=replace(self.job or Job(), **facts))


def json_safe(value: Any) -> Any:
    """Tuples as lists, mappings as plain dicts, all the way down."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _where(raw: Mapping[str, Any]) -> str:
    """Which place wrote a record without a `where` (the forms before schema 2)."""
    nodes = raw.get("nodes")
    if raw.get("cluster") or (isinstance(nodes, int) and not isinstance(nodes, bool)):
        return CLUSTER
    if isinstance(nodes, list) or "host" in raw:
        return HOSTS
    if any(key in raw for key in _JOB_ONLY):  # a job's record that does not name its cluster
        return CLUSTER
    return LOCAL


_JOB_ONLY = ("record_dir", "code_dir", "job_id", "batch_script", "submitted", "nproc_per_node")


def _launch(raw: Mapping[str, Any]) -> Launch:
    variables = _map(raw.get("variables"))
    return Launch(
        name=_str(raw.get("name")),
        template=_opt_bool(raw.get("template")),
        launcher=_str(raw.get("launcher")),
        script=_str(raw.get("script")),
        args=_opt_strs(raw.get("args")),
        argv=_strs(raw.get("argv")),
        python=_str(raw.get("python")),
        workdir=_str(raw.get("workdir")),
        out_dir=_str(raw.get("out_dir")),
        nproc_requested=_opt_str(raw.get("nproc_requested")),
        nproc=_opt_str(raw.get("nproc")),
        nnodes=_opt_str(raw.get("nnodes")),
        rdzv=_opt_str(raw.get("rdzv")),
        ifname=_str(raw.get("ifname")),
        env_keys=_opt_strs(raw.get("env_keys")),
        variables=variables,
        max_restarts=_opt_int(raw.get("max_restarts")),
        image=Image.from_json(raw),
        data=_maps(raw.get("data")),
    )


def _job(raw: Mapping[str, Any]) -> Job:
    return Job(
        nodes=_opt_int(raw.get("nodes")),
        tasks_per_node=_opt_int(raw.get("tasks_per_node")),
        nproc_per_node=_opt_int(raw.get("nproc_per_node")),
        world_size=_opt_int(raw.get("world_size")),
        gpus_per_node=_opt_int(raw.get("gpus_per_node")),
        partition=_opt_str(raw.get("partition")),
        time=_opt_str(raw.get("time")),
        max_requeues=_opt_int(raw.get("max_requeues")),
        epochs=_opt_int(raw.get("epochs")),
        submitted=_opt_float(raw.get("submitted")),
        record_dir=_str(raw.get("record_dir")),
        code_dir=_str(raw.get("code_dir")),
        metrics=_str(raw.get("metrics")),
        batch_script=raw.get("batch_script") is True,
        sbatch=_strs(raw.get("sbatch")),
        job_name=_opt_str(raw.get("job_name")),
        array=_opt_str(raw.get("array")),
        output=_opt_str(raw.get("output")),
        error=_opt_str(raw.get("error")),
        work_dir=_str(raw.get("work_dir")),
        job_id=_opt_str(raw.get("job_id")) or "",
        since=_opt_float(raw.get("since")),
        files_on=_str(raw.get("files_on")),
    )


def _job_json(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if job.batch_script:
        out.update(batch_script=True, sbatch=list(job.sbatch), job_name=job.job_name)
        out.update(array=job.array, output=job.output, error=job.error, work_dir=job.work_dir)
        out.update(nodes=job.nodes, partition=job.partition, time=job.time)
    else:
        out.update(
            epochs=job.epochs,
            nodes=job.nodes,
            tasks_per_node=job.tasks_per_node,
            nproc_per_node=job.nproc_per_node,
            world_size=job.world_size,
            gpus_per_node=job.gpus_per_node,
            partition=job.partition,
            time=job.time,
            max_requeues=job.max_requeues,
        )
    _put(out, "submitted", job.submitted)
    _put(out, "record_dir", job.record_dir)
    _put(out, "code_dir", job.code_dir)
    _put(out, "metrics", job.metrics)
    _put(out, "job_id", job.job_id)
    _put(out, "since", job.since)
    _put(out, "files_on", job.files_on)
    return out


def _local(raw: Mapping[str, Any]) -> LocalEnd:
    return LocalEnd(
        status=_str(raw.get("status")),
        cwd=_str(raw.get("cwd")),
        run_dir=_str(raw.get("run_dir")),
        pid=_opt_int(raw.get("pid")),
        start_time=_opt_str(raw.get("start_time")),
        end_time=_opt_str(raw.get("end_time")),
        exit_code=_opt_int(raw.get("exit_code")),
        error=_opt_str(raw.get("error")),
    )


# every key some form of run.json has had: the rest go to `extra`
_KNOWN_KEYS = """
schema where id run_id name template launcher script args argv python workdir out_dir
nproc_requested nproc nnodes rdzv ifname env_keys variables max_restarts data nodes master
host cluster code code_earlier store store_node recover max_recoveries hang_timeout on_hang
max_cost prices price_per_hour currency ran_before_s started tasks_per_node nproc_per_node
world_size gpus_per_node partition time max_requeues epochs submitted record_dir code_dir
metrics batch_script sbatch job_name array output error work_dir job_id since files_on status
cwd run_dir pid start_time end_time exit_code
"""
_KNOWN = frozenset(_KNOWN_KEYS.split()) | {*Image.KEYS, *Image.RESOLVED}


def schema(kind: type = RunRecord, prefix: str = "") -> list[tuple[str, str]]:
    """Every field of the record as `record` in the JSON has it, with its JSON type; a
    group's fields as `group.field` (the table in docs/reports.md)."""
    rows = []
    for f in fields(kind):
        rows.append((prefix + f.name, _json_type(str(f.type))))
        nested = _GROUPS.get(f.name)
        if nested is not None and kind in (RunRecord, Launch):
            rows += schema(nested, f"{prefix}{f.name}.")
    return rows


_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "tuple[str, ...]": "list of strings",
    "tuple[Mapping[str, Any], ...]": "list of objects",
    "Mapping[str, Any]": "object",
    "Mapping[str, float]": "object of numbers",
    "Mapping[str, str | None]": "object of strings or nulls",
}


def _json_type(annotation: str) -> str:
    base, null = annotation.removesuffix(" | None"), annotation.endswith(" | None")
    name = _TYPES.get(base, "object")  # a group
    return f"{name} or null" if null else name


_GROUPS: dict[str, type] = {
    "launch": Launch,
    "policy": Policy,
    "prices": Prices,
    "job": Job,
    "local": LocalEnd,
    "image": Image,
}
