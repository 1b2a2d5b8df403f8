"""`vmrun submit` as a library: the user's own batch script, unchanged, submitted from the
synced project on a cluster and then followed like any vmrun run (`logs`, `status`, `stop`,
`fetch` find it by its run id).

    from vmrun.operations.submit import SubmitOptions, submit
    code = submit(SubmitOptions("job.sh"), cluster="bed")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vmrun.backends.slurm.options import SlurmOptions
from vmrun.config import Settings, load_settings
from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.reporting import QUIET, Reporter


@dataclass
class SubmitOptions:
    """What is submitted: the script, the words after `--` (its arguments), the run's
    name, `--env KEY[=VALUE]` (sbatch's environment, which the job inherits) and `--data`."""

    script: str
    args: list[str] = field(default_factory=list)
    name: str | None = None
    env: list[str] | None = None
    data: list[str] | None = None
    # --recover: a copy of the script that requeues its job after a failure (consent: the
    # script is changed, so vmrun.toml's `recover` does not ask it)
    recover: bool = False
    max_recoveries: int | None = None


@dataclass(frozen=True)
class SubmitDryRun:
    """What `submit --dry-run` would do, nothing sent."""

    login: str
    sync: str  # "PROJECT -> CODE DIR"
    submit: list[str]  # the sbatch command, run in the code dir
    work_dir: str
    output: str  # the output file pattern, relative to work_dir unless absolute
    error: str
    array: str | None
    env_names: list[str]
    env_file: str
    data: list[str]


def pick_cluster(settings: Settings, cluster: str | None) -> str:
    """-C's cluster, or the project's only one."""
    return cluster or _the_only_cluster(settings)


def _the_only_cluster(settings: Settings) -> str:
    from vmrun.backends.slurm.cluster import project_clusters

    names = [c.name for c in project_clusters(settings)]
    if len(names) == 1:
        return names[0]
    raise UsageError(
        "say which cluster with -C NAME" + (f" (one of {', '.join(names)})" if names else ""),
        hint="" if names else "declare it in vmrun.toml: [[clusters]] name = ..., login = ...",
        code="cluster-not-found",
    )


def _needs_shared(settings: Settings, name: str) -> None:
    """A batch script writes where it says, on whichever node runs it: vmrun reads it back
    only from a folder every node sees."""
    from vmrun.backends.slurm.cluster import find_cluster

    if find_cluster(settings, name).synced:
        raise UsageError(
            f"submit needs a folder every node sees; cluster {name} was made without one",
            hint=f"run it with `vmrun train -C {name} SCRIPT`, or make the cluster again"
            f" with `vmrun setup --slurm {name} --shared PATH`",
            code="no-shared-folder",
        )


def submit(
    what: SubmitOptions,
    settings: Settings | None = None,
    *,
    cluster: str | None = None,
    slurm: SlurmOptions | None = None,
    dry_run: bool = False,
    detach: bool = False,
    out: Reporter = QUIET,
) -> int | SubmitDryRun:
    """Submit `what` to `cluster` and follow the job to its end (its exit code; a failure
    raises), or return once it is queued (`detach`), or the SubmitDryRun asked for."""
    from vmrun.backends.select import Target
    from vmrun.backends.slurm import batchfile, own_script
    from vmrun.backends.slurm.session import SlurmTraining, cluster_backend
    from vmrun.config import find_project_dir
    from vmrun.operations.train import data_dest
    from vmrun.runs.plan import data_access, parse_data
    from vmrun.ssh.envvars import parse_env

    settings = settings or load_settings({})
    slurm = slurm or SlurmOptions()
    refusals.check("submit", {"--recover": what.recover, "--max-recoveries": what.max_recoveries})
    recoveries = 0
    if what.recover:
        recoveries = refusals.recovery_limit(what.max_recoveries, settings.max_recoveries)
    target = Target.of(cluster=pick_cluster(settings, cluster))  # a batch script: Slurm's
    name = str(target.cluster)
    _needs_shared(settings, name)
    project = find_project_dir() or Path.cwd()
    data = tuple(parse_data(text) for text in what.data or ())
    access = data_access(data, settings.store_credentials)  # before anything starts
    env = parse_env(what.env)
    from vmrun.notify.send import Notify

    notify = Notify.from_settings(settings.notify, settings.notify_on) or None
    with cluster_backend(settings, name) as backend:
        given = own_script.given_words(slurm, backend.facts().version)
        batch = batchfile.read(Path(what.script), project, batchfile.parse_words(given))
        job = own_script.prepare(
            backend,
            batch,
            what.args,
            given=given,
            project_name=str(project),
            name=what.name,
            env={**backend.cluster.env, **env},
            notify=notify,
            recoveries=recoveries,
        )
        if dry_run:
            return SubmitDryRun(
                login=backend.cluster.login,
                sync=f"{project} -> {job.code_dir}",
                submit=["cd", job.code_dir, "&&", "sbatch", "--parsable", *job.sbatch],
                work_dir=job.record.job.work_dir if job.record.job else "",
                output=job.batch.output,
                error=job.batch.error,
                array=job.batch.array,
                env_names=sorted({*backend.cluster.env, *env}),
                env_file=f"{job.record_dir}/env",
                data=[f"{p} -> {data_dest(where, job.code_dir)}/{p.name}" for p, where in data],
            )
        ref = own_script.start(backend, job, project, out, out.progress(), data, access)
        training = SlurmTraining(backend)  # followed as any run on the cluster
        if detach:
            out.info(training.detached(ref))
            return 0
        return training.follow_and_tell(ref, notify, out)
