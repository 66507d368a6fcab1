"""hf-jobs: the async post's own deployment. One Hugging Face Job per machine, in one network group, sharing the run
directory through a Storage Bucket mounted at the same absolute path in every Job.

A Job is one machine, sized to what it runs. The scheduler shapes the plan's nodes into Jobs (`shape`): the trainer
node(s), with the services the placement puts beside the trainer (the routing proxy), and one node per vLLM engine.
`cluster.gpus_per_node` becomes the widest Job's GPU count (the plan's grid is uniform); each Job's flavor has the
GPUs its node uses (`flavor.*`, or the smallest h200 flavor with them). A vLLM Job runs the plan's `vllm serve`
argv directly in vLLM's official image, mounting the run directory read-only; a supervisor Job runs grpo-launch's
node supervisor (`python3 -m grpo_launch.launch --node K`) with the run directory read-write, in an image with
grpo-launch or one that installs the wheel uploaded with the run directory. Node K's address is the network group's
alias of its Job (`${HF_NETWORK_GROUP_PREFIX}<name>`), exported as GRPO_HOST_K where a supervisor runs.

`hf-jobs.sh` replays it by hand with `hf jobs run`; the launcher (`launch/schedulers/hf_jobs.py`) submits the same
Jobs through huggingface_hub's `run_job`, watches them and cancels them all at the end.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import hosts
from grpo_launch.contracts.devices import device_of
from grpo_launch.contracts.plan import JobSpec, NodeGroup, Plan, PrepareStep, Role, SchedulerPlan
from grpo_launch.contracts.rundir import HF_JOBS_FILE, WHEELS_DIR
from grpo_launch.contracts.schedulers import (
    DEFAULT_BUCKET_NAME,
    GROUP_LENGTH,
    RECIPE_LENGTH,
    RUN_HASH_LENGTH,
    HfJobsSettings,
    job_name_part,
)
from grpo_launch.contracts.shell import shell_word
from grpo_launch.contracts.vllm import VLLM_VERSION, unguarded
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.schedulers.base import ANSWERS_PY, Scheduler

PRICES_SOURCE = ("Hugging Face Jobs pricing (huggingface.co/docs/hub/jobs-pricing, hub-docs docs/hub/jobs-pricing.md): "
                 "hourly prices, billed by the minute while a Job starts or runs; `hf jobs hardware` lists today's")


@dataclass(frozen=True)
class Flavor:
    gpus: int                                  # 0: CPU only
    gpu: str | None                            # the GPU model
    per_hour: float                            # USD


# Every flavor of huggingface_hub's hardware list (JobHardware), with its GPUs and hourly price (PRICES_SOURCE).
FLAVORS = {
    "cpu-basic": Flavor(0, None, 0.01), "cpu-upgrade": Flavor(0, None, 0.03), "cpu-xl": Flavor(0, None, 1.00),
    "cpu-performance": Flavor(0, None, 1.90),
    "t4-small": Flavor(1, "T4", 0.40), "t4-medium": Flavor(1, "T4", 0.60),
    "l4x1": Flavor(1, "L4", 0.80), "l4x4": Flavor(4, "L4", 3.80),
    "l40sx1": Flavor(1, "L40S", 1.80), "l40sx4": Flavor(4, "L40S", 8.30), "l40sx8": Flavor(8, "L40S", 23.50),
    "a10g-small": Flavor(1, "A10G", 1.00), "a10g-large": Flavor(1, "A10G", 1.50),
    "a10g-largex2": Flavor(2, "A10G", 3.00), "a10g-largex4": Flavor(4, "A10G", 5.00),
    "a100-large": Flavor(1, "A100", 2.50), "a100x4": Flavor(4, "A100", 10.00), "a100x8": Flavor(8, "A100", 20.00),
    "h200": Flavor(1, "H200", 5.00), "h200x2": Flavor(2, "H200", 10.00), "h200x4": Flavor(4, "H200", 20.00),
    "h200x8": Flavor(8, "H200", 40.00),
    "rtx-pro-6000": Flavor(1, "RTX PRO 6000", 2.75), "rtx-pro-6000x2": Flavor(2, "RTX PRO 6000", 5.50),
    "rtx-pro-6000x4": Flavor(4, "RTX PRO 6000", 11.00), "rtx-pro-6000x8": Flavor(8, "RTX PRO 6000", 22.00),
}
EXPOSED_PORTS_PER_HOUR = 0.01                  # a Job exposing ports, on top of its flavor (PRICES_SOURCE)
GPU_FAMILY = ("h200", "h200x2", "h200x4", "h200x8")  # the seed's: what a GPU Job gets when no flavor is given
CPU_FLAVOR = "cpu-upgrade"                     # 8 vCPU, 32 GB: a CPU Job's when no flavor is given
GROUP_PREFIX = "${HF_NETWORK_GROUP_PREFIX}"    # set in every Job of a network group; + alias = that Job's host
HEALTH = "/health"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TIMEOUT = re.compile(r"\d+(\.\d+)?[smhd]?")
KEY = "scheduler.hf_jobs"


def library_flavors() -> tuple[str, ...]:
    """The flavors huggingface_hub itself lists (`JobHardware`, kept in sync with the Hub API by its maintainers)."""
    try:
        from huggingface_hub import JobHardware
    except ImportError:
        raise UserError("scheduler=hf-jobs needs huggingface_hub >= 1.32 (Jobs with network groups, Storage "
                        "Buckets)", key="scheduler.kind", hint="pip install 'grpo-launch[hf-jobs]'") from None
    return tuple(h.value for h in JobHardware)


def bucket_of(s: HfJobsSettings) -> str:
    return s.bucket or f"{s.namespace or '<namespace>'}/{DEFAULT_BUCKET_NAME}"


def _check_flavor(flavor: str | None, key: str, known: tuple[str, ...], cuda: bool) -> None:
    if flavor is None:
        return
    if flavor not in known:
        raise UserError(f"'{key}' is {flavor!r}, not a flavor of huggingface_hub's hardware list"
                        f"{did_you_mean(flavor, known)}", key=key, hint=f"one of {', '.join(known)}")
    if cuda and not FLAVORS[flavor].gpus:
        raise UserError(f"'{key}' is {flavor}, a CPU flavor, for a plan on GPUs (cluster.accelerator=cuda)", key=key,
                        hint=f"a GPU flavor, e.g. {', '.join(GPU_FAMILY)}; or null to size it from the plan")


def check_settings(config: Config) -> None:
    """Every scheduler.hf_jobs value is checked before anything is planned: each error names its key."""
    s: HfJobsSettings = config.scheduler.hf_jobs
    if s.namespace is not None and not NAME.fullmatch(s.namespace):
        raise UserError(f"'{KEY}.namespace' is {s.namespace!r}: a user or organization name", key=f"{KEY}.namespace",
                        hint="letters, digits, '-', '_' and '.', e.g. my-org; or null for your own account")
    if s.bucket is not None and (s.bucket.count("/") != 1 or not all(map(NAME.fullmatch, s.bucket.split("/")))):
        raise UserError(f"'{KEY}.bucket' is {s.bucket!r}, not namespace/name", key=f"{KEY}.bucket",
                        hint=f"e.g. {s.namespace or 'my-org'}/{DEFAULT_BUCKET_NAME} (letters, digits, '-', '_' and "
                             f"'.'); or null for <namespace>/{DEFAULT_BUCKET_NAME}")
    m = s.mount_path
    if not m.startswith("/") or posixpath.normpath(m) != m or m == "/" or re.search(r"[\s:'\"\\$`]", m):
        raise UserError(f"'{KEY}.mount_path' is {m!r}: every Job mounts the run directory at this absolute path",
                        key=f"{KEY}.mount_path", hint="an absolute, normalized path other than /, without spaces, "
                                                      "':' or quotes, e.g. /grpo")
    for i, secret in enumerate(s.secrets):
        key = f"{KEY}.secrets[{i}]"
        if "=" in secret:
            raise UserError(f"'{key}' gives a secret's value ({secret.split('=', 1)[0]}=...): secrets go by name only",
                            key=key, hint=f"write only its name ({secret.split('=', 1)[0]}); its value is read from "
                                          f"your environment when the Jobs are submitted, and never written")
        if not VARIABLE.fullmatch(secret):
            raise UserError(f"'{key}' is {secret!r}, not an environment variable's name", key=key,
                            hint="letters, digits and '_', not starting with a digit, e.g. HF_TOKEN")
    if not TIMEOUT.fullmatch(s.timeout):
        raise UserError(f"'{KEY}.timeout' is {s.timeout!r}", key=f"{KEY}.timeout",
                        hint="seconds, or a number with s, m, h or d, e.g. 6h")
    for kind in ("trainer", "vllm"):
        image = getattr(s.image, kind)
        if image is not None and not re.fullmatch(r"[A-Za-z0-9][\w.:/@-]*", image):
            raise UserError(f"'{KEY}.image.{kind}' is {image!r}, not a Docker image reference",
                            key=f"{KEY}.image.{kind}", hint="e.g. vllm/vllm-openai:v" + VLLM_VERSION)
    known = library_flavors()
    for kind in ("trainer", "vllm"):
        _check_flavor(getattr(s.flavor, kind), f"{KEY}.flavor.{kind}", known,
                      device_of(config.cluster.accelerator).gpus)
    if config.data.source == "files":
        raise UserError("data.source=files: the Jobs see only the run directory, and a dataset file on this machine "
                        "is not in it", key="data.source", hint="put the dataset on the hub (data.source=hub)")


def default_flavor(gpus: int, cuda: bool) -> str:
    if not cuda:
        return CPU_FLAVOR
    fitting = [f for f in GPU_FAMILY if FLAVORS[f].gpus >= gpus]
    if not fitting:
        raise UserError(f"a Job would need {gpus} GPUs; one Job is one machine of at most "
                        f"{FLAVORS[GPU_FAMILY[-1]].gpus}", key="cluster.gpus_per_node",
                        hint="fewer GPUs for the trainer, or a lower vllm.tensor_parallel_size")
    return fitting[0]


def _flavor(given: str | None, gpus: int, cuda: bool, key: str) -> str:
    if given is None:
        return default_flavor(gpus, cuda)
    if FLAVORS[given].gpus < gpus:
        raise UserError(f"'{key}' is {given} ({FLAVORS[given].gpus} GPU(s)), but its Job runs on {gpus} GPUs",
                        key=key, hint=f"a flavor with {gpus} GPUs or more, e.g. {default_flavor(gpus, cuda)}; or "
                                      f"null to size it from the plan")
    return given


def vllm_image(s: HfJobsSettings) -> str:
    return s.image.vllm or f"vllm/vllm-openai:v{VLLM_VERSION}"


def _supervisor_script(config: Config, node: int, names: dict[int, str], extras: str) -> str:
    """What a supervisor Job runs: the setup lines, grpo-launch's wheel installed, every node's address exported
    from the network group (expanded where the Job runs), then this node's supervisor in the run directory."""
    s: HfJobsSettings = config.scheduler.hf_jobs
    mount = shell_word(s.mount_path)
    lines = ["set -eu", *config.scheduler.setup]
    if s.install_wheel:
        lines.append(f'pip install --quiet "$(echo {mount}/{WHEELS_DIR}/grpo_launch-*.whl)[{extras}]"')
    lines.append("export " + " ".join(f'{hosts.VARIABLE.format(node=n)}="{GROUP_PREFIX}{name}"'
                                      for n, name in sorted(names.items())))
    lines.append(f"cd {mount}")
    lines.append(f"exec python3 -m grpo_launch.launch --run-dir {mount} --node {node}")
    return "\n".join(lines)


class HfJobs(Scheduler):
    name = "hf-jobs"
    job_file = HF_JOBS_FILE
    sized_machines = True
    shares_run_dir = True

    def check(self, config: Config) -> None:
        super().check(config)
        check_settings(config)

    def host(self, config: Config, node: int) -> str:
        return hosts.reference(node)  # the Job's alias in the network group, exported where a supervisor runs

    def shape(self, config: Config, packed) -> tuple[Config, int | None]:
        """The trainer nodes as the recipe's cluster gives them, and one node more per vLLM engine."""
        layout: Layout = packed(config)
        if not layout.engine_gpus:
            return config, None
        tp = len(layout.engine_gpus[0][1])
        trainer_gpus = len(layout.trainer_gpus)
        cluster = replace(config.cluster, nodes=len(layout.trainer_nodes) + len(layout.engine_gpus),
                          gpus_per_node=max(trainer_gpus, tp))
        placement = replace(config.placement, trainer_nodes=len(layout.trainer_nodes))
        return replace(config, cluster=cluster, placement=placement), trainer_gpus

    def job(self, config: Config, plan: Plan) -> tuple[SchedulerPlan, dict[str, Any]]:
        s: HfJobsSettings = config.scheduler.hf_jobs
        cuda = plan.device.gpus
        by_node = {n: [p for p in plan.processes if p.node == n] for n in range(plan.nodes)}
        served = {n: ps[0] for n, ps in by_node.items() if len(ps) == 1 and ps[0].role == Role.VLLM}
        names = {n: served[n].name if n in served else next(
            (p.name for p in ps if p.role == Role.TRAINER), f"node-{n}") for n, ps in by_node.items()}
        extras = "train" + (",deepspeed" if config.zero.stage else "")
        jobs = []
        for n in sorted(by_node, key=lambda n: (n not in served, n)):  # vLLM first: the trainer waits for them
            ps = by_node[n]
            gpus = max((len(p.gpus) for p in ps), default=0) if cuda else 0
            if n in served:
                p = served[n]
                flavor = _flavor(s.flavor.vllm, gpus, cuda, f"{KEY}.flavor.vllm")
                # vLLM's image has no grpo-launch for the replica key's guard; the Hub guards the port instead:
                # it is exposed only behind the Hub's proxy, to a token of the namespace, and the network group
                # holds this run's Jobs alone (its name is the run's own).
                command = ("bash", "-c", f"cd {shell_word(s.mount_path)} && exec "
                                         + " ".join(shell_word(a) for a in unguarded(p.argv)))
                jobs.append(JobSpec(
                    name=names[n], node=n, processes=(p.name,), supervisor=False, image=vllm_image(s),
                    command=command, env=dict(p.env), secrets=tuple(s.secrets), flavor=flavor, gpus=gpus,
                    price_per_hour=FLAVORS[flavor].per_hour + EXPOSED_PORTS_PER_HOUR, read_only=True,
                    expose=(p.port,), address=f"{GROUP_PREFIX}{names[n]}:{p.port}", health=HEALTH,
                    ready_timeout_s=p.ready_timeout_s, max_restarts=p.restart.max_restarts if p.restart else 0))
            else:
                flavor = _flavor(s.flavor.trainer, gpus, cuda, f"{KEY}.flavor.trainer")
                jobs.append(JobSpec(
                    name=names[n], node=n, processes=tuple(p.name for p in ps), supervisor=True,
                    image=s.image.trainer or vllm_image(s),
                    command=("bash", "-c", _supervisor_script(config, n, names, extras)),
                    env={"PYTHONUNBUFFERED": "1"}, secrets=tuple(s.secrets), flavor=flavor, gpus=gpus,
                    price_per_hour=FLAVORS[flavor].per_hour, read_only=False, expose=(),
                    address=f"{GROUP_PREFIX}{names[n]}"))
        groups = tuple(NodeGroup(
            j.name, (j.node,), j.processes,
            f"{'python3 -m grpo_launch.launch --node ' + str(j.node) if j.supervisor else 'vllm serve'} in "
            f"{j.image} on {j.flavor}",
            "when training ends (every other Job is then cancelled)" if j.supervisor else
            "cancelled when the trainer Job ends; restarted if it dies while serving" if j.max_restarts else
            "cancelled when the trainer Job ends") for j in jobs)
        price = round(sum(j.price_per_hour for j in jobs), 2)
        scheduled = SchedulerPlan(
            kind=self.name, job_file=self.job_file, submit=("bash", self.job_file),
            node_rank="each supervisor Job's command names its node (--node K); a vLLM Job runs one process",
            addresses=f"GRPO_HOST_K: {GROUP_PREFIX}<node K's Job>, its alias in the run's network group, exported "
                      f"by the supervisor Jobs", groups=groups, jobs=tuple(jobs),
            storage=f"hf://buckets/{bucket_of(s)}/<recipe>-<run>, mounted at {s.mount_path} in every Job (the "
                    f"supervisors read-write, vLLM read-only)", price_per_hour=price)
        trainer = names[plan.trainer_nodes[0]]
        return scheduled, {self.job_file: hf_jobs_script(config, plan.recipe, jobs, trainer, plan.prepare, price)}

    def warnings(self, config: Config, plan: SchedulerPlan) -> list[str]:
        out = []
        for j in plan.jobs:
            if j.gpus and FLAVORS[j.flavor].gpus > j.gpus:
                out.append(f"Job {j.name} runs on {j.gpus} of its {j.flavor}'s {FLAVORS[j.flavor].gpus} GPUs: the "
                           f"others are billed idle")
        cuda = device_of(config.cluster.accelerator).gpus
        gpu_models = {FLAVORS[j.flavor].gpu for j in plan.jobs if FLAVORS[j.flavor].gpu}
        if cuda and gpu_models and config.cluster.gpu_type not in gpu_models:
            out.append(f"cluster.gpu_type={config.cluster.gpu_type} ({config.cluster.gpu_memory_gib:g} GiB), but the "
                       f"Jobs run on {', '.join(sorted(gpu_models))}: the memory estimate is for "
                       f"{config.cluster.gpu_type}")
        if not cuda and config.scheduler.hf_jobs.image.vllm is None:
            out.append(f"cluster.accelerator=cpu: {vllm_image(config.scheduler.hf_jobs)} is vLLM's CUDA build; set "
                       f"{KEY}.image.vllm to a CPU build of vLLM for CPU Jobs")
        return out


# -- hf-jobs.sh ------------------------------------------------------------------------------------------------------

_SCRIPT_HEADER = """#!/usr/bin/env bash
# grpo-launch: run '{recipe}' (placement {placement}) as {count} Hugging Face Jobs in one network group, sharing
# this run directory through a Storage Bucket: what `grpo run` does, by hand, with huggingface_hub's `hf` CLI
# (>= 1.32), logged in (`hf auth login`). Run it from the run directory: `bash {file}`.
# `DRY_RUN=1 bash {file}` prints every Job as `hf jobs run --dry-run` resolves it, and starts nothing.
# Secrets go by name ({secrets}): their values are read from your environment, never written.
# About ${price:.2f}/h while every Job runs ({source}). The vLLM Jobs start together and are waited for on their
# exposed /health; one that dies is not restarted here (`grpo run` restarts it). Ctrl-C, a failure or the end of
# the trainer Job cancels every Job of this run (found by its label too). The Hub's transient failures (5xx, 429,
# timeouts, dropped connections, a log stream cut) are asked again; a Hub silent for longer than
# control_plane_timeout_s leaves the Jobs as they are, says so, and exits 75.
# shellcheck disable=SC2016  # each Job's command is single-quoted: what it expands, it expands where the Job runs
set -euo pipefail
cd "$(dirname "$0")"
dry_run="${{DRY_RUN:-0}}"
namespace="${{HF_JOBS_NAMESPACE:-{namespace}}}"
bucket={bucket}
run_id="$(printf '%s-%s' {slug} "$(basename "$PWD")" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9-' '-' \\
  | cut -c1-{length})"
run_id="$run_id-$(printf '%s' "$(pwd -P)" | sha256sum | cut -c1-{hash})"  # this directory's: told from every other
mount={mount}
control_plane_timeout_s={bound}  # scheduler.control_plane_timeout_s
left_running=0
submitted=()
hub() {{  # ready JOB_ID TIMEOUT_S | follow JOB_ID | cancel [JOB_ID...], asked of the Hub; 75: it stayed silent
  local code=0
  python3 - "$namespace" "$run_id" "$control_plane_timeout_s" "$@" <<'PY' || code=$?
{hub_py}PY
  [ "$code" != 75 ] || left_running=1
  return "$code"
}}
cancel_all() {{  # every Job of this run not ended: those submitted here, and any other carrying its label
  [ "$dry_run" != 1 ] || return 0
  if [ "$left_running" = 1 ]; then
    echo "grpo: the Hub answered nothing for $control_plane_timeout_s s: the Jobs are left as they are, maybe" \\
      "running; once it answers: hf jobs ps --namespace $namespace --label grpo-run=$run_id, hf jobs cancel ID" >&2
    return 0
  fi
  hub cancel "${{submitted[@]}}" || echo "grpo: not every Job could be cancelled: hf jobs ps --namespace" \\
    "$namespace --label grpo-run=$run_id" >&2
}}
trap cancel_all EXIT
trap 'exit 130' INT TERM
submit() {{  # `hf jobs run` of one Job, detached: prints its ID (DRY_RUN=1: its configuration, nothing submitted)
  if [ "$dry_run" = 1 ]; then
    hf jobs run --dry-run "$@" >&2
    echo "dry-run-${{#submitted[@]}}"
  else
    hf jobs run --detach --format json "$@" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
  fi
}}
wait_ready() {{  # JOB_ID TIMEOUT_S: until its exposed /health answers; fails at once when the Job ends
  [ "$dry_run" = 1 ] && return 0
  hub ready "$1" "$2"
}}

"""

# What hf-jobs.sh asks of the Hub, in Python (huggingface_hub), each call asked again through the Hub's transient
# failures as `grpo run` asks (launch/schedulers/hf_jobs.py: `transient`): a 5xx, a 429 after its Retry-After, a
# timeout, a dropped connection; silent for the bound, it exits 75 and the Jobs are left as they are.
_HUB_PY = """import signal, sys, time, urllib.request
signal.signal(signal.SIGINT, signal.SIG_DFL)
import httpx
from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import get_session
{answers}TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
namespace, group, bound, command, args = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5:]
get_session().timeout = httpx.Timeout(min(30.0, bound / 3))  # a request's wait for an answer, bounded
api, silent = HfApi(), None  # silent: since when the Hub has answered nothing but transient failures


def passing(error):
    \"\"\"How long a transient failure asks to be waited (0: backoff); None for an answer that refuses.\"\"\"
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        status, after = error.response.status_code, error.response.headers.get("Retry-After", "")
        return (float(after) if after.isdigit() else 0.0) if status >= 500 or status == 429 else None
    return 0.0 if isinstance(error, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)) else None


def ask(what, call, **kwargs):
    \"\"\"call(**kwargs) through the Hub's transient failures; exit 75 once it has been silent for the bound.\"\"\"
    global silent
    tries = 0
    while True:
        try:
            answer = call(**kwargs)
        except Exception as e:
            after = passing(e)
            if after is None:
                raise
            now = time.monotonic()
            silent = silent or now
            if now - silent >= bound:
                print(f"grpo: the Hub answered nothing for {{now - silent:.0f}} s ({{what}}: {{e!r:.200}})",
                      file=sys.stderr)
                sys.exit(75)
            wait, tries = min(after or 2.0 ** tries, 30.0, bound - (now - silent)), tries + 1
            print(f"grpo: {{what}}: {{e!r:.200}}; asking again in {{wait:.0f}} s", file=sys.stderr)
            time.sleep(wait)
            continue
        silent = None
        return answer


def stage(job_id):
    return str(ask(f"reading Job {{job_id}}'s stage", api.inspect_job, job_id=job_id, namespace=namespace).status.stage)


if command == "ready":  # JOB_ID TIMEOUT_S: until its exposed /health answers; fails at once when the Job ends
    job_id, token, deadline = args[0], get_token(), time.time() + float(args[1])
    while time.time() < deadline:
        job = ask(f"reading Job {{job_id}}'s stage", api.inspect_job, job_id=job_id, namespace=namespace)
        if job.status.stage in TERMINAL:
            print("\\n".join(api.fetch_job_logs(job_id=job_id, namespace=namespace, tail=25)), file=sys.stderr)
            sys.exit(f"Job {{job_id}} ended ({{job.status.stage}}: {{job.status.message}}) before it served")
        headers = {{"Authorization": f"Bearer {{token}}"}}
        if any(answers(url + "{health}", headers) for url in job.status.expose_urls or ()):
            sys.exit(0)
        time.sleep(5)
    sys.exit(f"Job {{job_id}} did not answer {health} within {{args[1]}} s")
elif command == "follow":  # JOB_ID: its log to its end; a stream that ends while it runs is attached again
    job_id, written, wait, last = args[0], 0, 1.0, False
    while True:
        why = None
        try:
            for i, line in enumerate(api.fetch_job_logs(job_id=job_id, namespace=namespace, follow=True)):
                if i >= written:  # the Hub replays the log from its start: the lines printed already are skipped
                    print(line, flush=True)
                    written, wait = written + 1, 1.0
        except Exception as e:
            if passing(e) is None:
                raise
            why = repr(e)[:200]
        if last and (why is None or time.monotonic() > give_up):  # (its last lines asked for within the bound)
            break
        if not last:
            now = stage(job_id)
            if now in TERMINAL:
                if why is None:
                    break
                last, give_up = True, time.monotonic() + bound  # its last lines, at once: the Hub replays an
                continue                                        # ended Job's whole log, then ends it
            print(f"grpo: the log stream of Job {{job_id}} ended while it is {{now}} ({{why or 'cut'}}); attaching "
                  f"again in {{wait:.0f}} s", file=sys.stderr)
        time.sleep(wait)
        wait = min(30.0, wait * 2)
    print(f"grpo: the trainer Job ended {{now}}", flush=True)
    sys.exit(0 if now == "COMPLETED" else 1)
elif command == "cancel":  # [JOB_ID...]: these, and every other Job carrying the run's label, unless ended
    found = ask("listing the run's Jobs", lambda: {{j.id: str(j.status.stage) for j in api.list_jobs(
        labels={{"grpo-run": group}}, namespace=namespace) if (j.labels or {{}}).get("grpo-run") == group}})
    for job_id in dict.fromkeys([*args, *found]):
        if (found.get(job_id) or stage(job_id)) not in TERMINAL:
            ask(f"cancelling Job {{job_id}}", api.cancel_job, job_id=job_id, namespace=namespace)
"""

_SCRIPT_UPLOAD = """# The run directory into the bucket, mounted at $mount in every Job.
if [ "$dry_run" != 1 ]; then
{wheel}  hf buckets create "$bucket" --private --exist-ok
  hf buckets sync . "hf://buckets/$bucket/$run_id"
fi

"""
_SCRIPT_WHEEL = "  ls {wheels}/grpo_launch-*.whl >/dev/null 2>&1 || python3 -m grpo_launch.launch.wheel {wheels}\n"

_SCRIPT_TAIL = """
# Follow the trainer Job's log to its end (attached again when the stream is cut while it runs), bring the run
# directory back; the trainer's stage names the exit code. The EXIT trap cancels every Job, unless the Hub stayed
# silent (75): then they are left as they are, and it says so.
[ "$dry_run" = 1 ] && exit 0
code=0
hub follow "$trainer" || code=$?
[ "$code" != 75 ] || exit 75
hf buckets sync "hf://buckets/$bucket/$run_id" .  # the run directory back: logs, metrics, checkpoints
[ "$code" = 0 ]
"""


def _variable(j: JobSpec) -> str:
    return "job_" + j.name.replace("-", "_")


def _job_lines(j: JobSpec) -> str:
    args = ["--namespace", '"$namespace"', "--flavor", shell_word(j.flavor), "--timeout", '"$timeout"',
            "--name", f'"$run_id-{j.name}"', "--label", '"grpo-run=$run_id"',
            "--volume", f'"hf://buckets/$bucket/$run_id:$mount:{"ro" if j.read_only else "rw"}"']
    for secret in j.secrets:
        args += ["--secrets", shell_word(secret)]
    for key, value in j.env.items():
        args += ["--env", shell_word(f"{key}={value}")]
    for port in j.expose:
        args += ["--expose", str(port)]
    args += ["--network-group", '"$run_id"', "--network-alias", shell_word(j.name), shell_word(j.image),
             *(shell_word(a) for a in j.command)]
    variable = _variable(j)
    what = f"grpo-launch's supervisor of node {j.node}" if j.supervisor else "vllm serve, read-only mount"
    lines = [f"# {j.name}: {what} ({', '.join(j.processes)}) on {j.flavor}, ${j.price_per_hour:.2f}/h; the others "
             f"reach it at {j.address}",
             f"{variable}=\"$(submit " + " \\\n    ".join(_pairs(args)) + ')"',
             f'submitted+=("${variable}"); echo "grpo: {j.name} is Job ${variable}"']
    return "\n".join(lines) + "\n"


def _pairs(args: list[str]) -> list[str]:
    """An option and its value on one line of the script."""
    out, i = [], 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args):
            out.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(" ".join(args[i:]))
            break
    return out


def hf_jobs_script(config: Config, recipe: str, jobs: list[JobSpec], trainer: str, prepare: Sequence[PrepareStep],
                   price: float) -> str:
    """The script: the run directory built and uploaded, each Job submitted in turn (the vLLM Jobs waited for on
    their exposed /health), then the trainer Job (`trainer`) followed to its end."""
    s: HfJobsSettings = config.scheduler.hf_jobs
    namespace = shell_word(s.namespace) if s.namespace else \
        "$(python3 -c 'from huggingface_hub import whoami; print(whoami()[\"name\"])')"
    bucket = shell_word(s.bucket) if s.bucket else f'"$namespace/{DEFAULT_BUCKET_NAME}"'
    text = _SCRIPT_HEADER.format(
        recipe=recipe, placement=config.placement.kind, count=len(jobs), file=HF_JOBS_FILE,
        secrets=", ".join(s.secrets) or "none", price=price, source=PRICES_SOURCE.split(" (")[0],
        namespace=namespace, bucket=bucket, slug=shell_word(job_name_part(recipe)[:RECIPE_LENGTH]),
        length=GROUP_LENGTH - RUN_HASH_LENGTH - 1, hash=RUN_HASH_LENGTH, mount=shell_word(s.mount_path),
        bound=shell_word(f"{config.scheduler.control_plane_timeout_s:g}"),
        hub_py=_HUB_PY.format(answers=ANSWERS_PY, health=HEALTH))
    text += f"timeout={shell_word(s.timeout)}\n\n"
    for step in prepare:  # built here, before the upload: the vLLM Jobs read it before any supervisor runs
        text += f"# {step.name}: built here, uploaded with the run directory\n"
        text += (f"[ -e {shell_word(step.creates)} ] || [ \"$dry_run\" = 1 ] || "
                 f"{' '.join(shell_word(a) for a in step.argv)}\n")
    text += _SCRIPT_UPLOAD.format(wheel=_SCRIPT_WHEEL.format(wheels=WHEELS_DIR) if s.install_wheel else "")
    servers = [j for j in jobs if j.health]
    text += "".join(_job_lines(j) for j in servers)
    if servers:
        text += "# Every vLLM Job serving before the trainer starts (they load the model at once).\n"
        text += "".join(f'wait_ready "${_variable(j)}" {j.ready_timeout_s:g}  # {j.name}\n' for j in servers)
    text += "".join(_job_lines(j) for j in jobs if not j.health)
    text += f'trainer="${_variable(next(j for j in jobs if j.name == trainer))}"\n'
    return text + _SCRIPT_TAIL
