"""A throwaway, real Slurm cluster on loopback, for the Slurm tests: slurmctld, one slurmd per node (`slurmd -N
NAME`, every node at 127.0.0.1 on its own port) and munged, with fake GPUs (character devices in gres.conf, so
Slurm sets each step's CUDA_VISIBLE_DEVICES). Starts in about a second, stops in a fraction of one.

Stdlib only. Needs root and Debian's packages (`make test` installs them where it can):
    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge

    with LoopbackSlurm("/tmp/slurm-a", nodes=2, gpus_per_node=2) as c:
        subprocess.run(["sbatch", ...], env=c.env())   # c.env(): SLURM_CONF and PATH for every Slurm command
        c.job_state(job_id), c.job_processes()

Everything (config, munge key and socket, pid files, logs, spool, state, fake GPU device nodes) lives under
``state_dir``; two clusters with different state dirs and ports never share a file. `LoopbackSlurm(same_dir).stop()`
also cleans up after a crashed run, and `start()` first kills what a crashed run left.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

__all__ = ["LoopbackSlurm", "SlurmError", "missing"]

SLURM_BINARIES = ("slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scontrol",
                  "scancel", "squeue", "munged")
# process names (comm, /proc/PID/comm is truncated to 15 chars) we may kill
_DAEMON_COMMS = ("slurmctld", "slurmd", "slurmstepd", "munged")


class SlurmError(RuntimeError):
    pass


def missing() -> str | None:
    """Why no loopback cluster can run here, or None: it needs root (mknod, SlurmUser=root) and the binaries."""
    if os.geteuid() != 0:
        return "a loopback Slurm cluster needs root (fake GPU device nodes, SlurmUser=root)"
    absent = [b for b in SLURM_BINARIES if not _find(b)]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): as root, `make test` installs it, or "
                f"apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge")
    return None


def _find(name: str) -> str | None:
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def _which(name: str) -> str:
    p = _find(name)
    if not p:
        raise SlurmError(f"{name} not found: apt-get install slurmctld slurmd slurm-client munge")
    return p


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(table).decode(errors="replace").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def _pids_holding(inodes: set[str]) -> set[int]:
    pids = set()
    if not inodes:
        return pids
    want = {f"socket:[{i}]" for i in inodes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                try:
                    if os.readlink(f"/proc/{d}/fd/{fd}") in want:
                        pids.add(int(d))
                        break
                except OSError:
                    pass
        except OSError:
            pass
    return pids


class LoopbackSlurm:
    """A Slurm cluster of ``nodes`` nodes n1..nN, all on 127.0.0.1.

    Each node gets ``cpus_per_node`` CPUs (may exceed the real core count:
    SlurmdParameters=config_overrides makes slurmd trust slurm.conf) and
    ``gpus_per_node`` fake GPUs (character devices /dev/null-alike, c 1 3) so
    Slurm sets CUDA_VISIBLE_DEVICES per step.
    """

    def __init__(self, state_dir, nodes: int = 2, gpus_per_node: int = 2,
                 cpus_per_node: int = 4, ctld_port: int = 16817,
                 slurmd_base_port: int = 17001, partition: str = "debug",
                 real_memory_mb: int = 4096, cluster_name: str | None = None,
                 node_prefix: str = "n", start_timeout: float = 30.0,
                 evict_port_holders: bool = True):
        self.state_dir = Path(state_dir).resolve()
        self.nodes = int(nodes)
        self.gpus_per_node = int(gpus_per_node)
        self.cpus_per_node = int(cpus_per_node)
        self.ctld_port = int(ctld_port)
        self.slurmd_base_port = int(slurmd_base_port)
        self.partition = partition
        self.real_memory_mb = int(real_memory_mb)
        self.cluster_name = cluster_name or f"loop{self.ctld_port}"
        self.node_prefix = node_prefix
        self.start_timeout = start_timeout
        self.evict_port_holders = evict_port_holders
        # AF_UNIX socket paths (munge socket, slurmd's per-step sockets in its
        # spool) must stay under ~107 bytes: for a deep state_dir (pytest's
        # tmp_path) refer to it through a short symlink /tmp/lbslurm-<hash>.
        self.short_link = None
        d = self.state_dir
        if len(str(d)) > 48:
            import hashlib
            self.short_link = Path("/tmp") / ("lbslurm-" + hashlib.sha1(str(d).encode()).hexdigest()[:10])
            d = self.short_link
        self.root = d
        self.etc, self.log_dir, self.run_dir = d / "etc", d / "log", d / "run"
        self.munge_dir, self.spool, self.statesave = d / "munge", d / "spool", d / "state"
        self.dev_dir = d / "dev"
        self.conf = self.etc / "slurm.conf"
        self.munge_socket = self.munge_dir / "munge.sock"
        self._procs: dict[str, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ info
    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(1, self.nodes + 1)]

    @property
    def ports(self) -> list[int]:
        return [self.ctld_port] + [self.slurmd_base_port + i for i in range(self.nodes)]

    def env(self, base: dict | None = None) -> dict:
        """Environment for Slurm commands: ``subprocess.run(..., env=c.env())``.
        Inherits os.environ (PATH etc.) minus any SLURM_* from an outer job."""
        e = {k: v for k, v in (os.environ if base is None else base).items()
             if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_"))}
        e["SLURM_CONF"] = str(self.conf)
        e["LOOPBACK_SLURM_DIR"] = str(self.state_dir)   # tag used to find our processes
        e["PATH"] = e.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        return e

    def run(self, args, check: bool = True, timeout: float = 120, **kw):
        """Run a Slurm client command (list or shell string) in the cluster env."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        shell = isinstance(args, str)
        p = subprocess.run(args, shell=shell, env=kw.pop("env", None) or self.env(),
                           timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise SlurmError(f"{args!r} -> rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    # --------------------------------------------------------------- config
    def slurm_conf_text(self) -> str:
        d = self.root
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "MpiDefault=none",
            # linuxproc: follows every descendant of a task (no cgroups needed); a process that re-parents to init
            # escapes it, which the tests check for
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "EnforcePartLimits=ALL",   # reject impossible jobs at submit (else they pend forever)
            f"StateSaveLocation={self.statesave}",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            f"PlugStackConfig={self.etc}/plugstack.conf",
            "MailProg=/bin/true",
            "KillWait=5",
            "InactiveLimit=0",
            "MinJobAge=60",
            "SlurmdTimeout=30",
            "SlurmctldTimeout=30",
            "MessageTimeout=10",
            f"TmpFS={d}/tmp",
            "GresTypes=gpu" if self.gpus_per_node else "",
        ]
        for i, name in enumerate(self.node_names):
            gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname=localhost "
                f"Port={self.slurmd_base_port + i} CPUs={self.cpus_per_node} "
                f"RealMemory={self.real_memory_mb}{gres} State=UNKNOWN")
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
        return "\n".join(line for line in lines if line) + "\n"

    def gres_conf_text(self) -> str:
        if not self.gpus_per_node:
            return ""
        return "".join(
            f"NodeName={n} Name=gpu File={self.dev_dir}/{n}/nvidia[0-{self.gpus_per_node - 1}]\n"
            for n in self.node_names)

    def _write_files(self):
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)
        if self.short_link is not None:
            if os.path.islink(self.short_link) or self.short_link.exists():
                if os.path.realpath(self.short_link) != str(self.state_dir):
                    os.unlink(self.short_link)
            if not os.path.islink(self.short_link):
                os.symlink(self.state_dir, self.short_link)
        d = self.root
        # fresh state every start: a throwaway cluster must not resurrect old jobs
        for sub in (self.statesave, self.spool, self.run_dir, self.munge_dir, d / "tmp"):
            shutil.rmtree(sub, ignore_errors=True)
        for sub in (self.etc, self.log_dir, self.run_dir, self.spool, self.statesave,
                    self.munge_dir, self.dev_dir, d / "tmp"):
            sub.mkdir(parents=True, exist_ok=True)
            os.chmod(sub, 0o755)   # munged refuses a socket dir that is not o+x
        for n in self.node_names:
            (self.spool / n).mkdir(exist_ok=True)
        self.conf.write_text(self.slurm_conf_text())
        (self.etc / "gres.conf").write_text(self.gres_conf_text())
        (self.etc / "plugstack.conf").write_text("")
        # fake GPUs: character devices (plain files give no CUDA_VISIBLE_DEVICES)
        for n in self.node_names:
            nd = self.dev_dir / n
            nd.mkdir(exist_ok=True)
            for g in range(self.gpus_per_node):
                f = nd / f"nvidia{g}"
                try:
                    st = os.lstat(f)
                    if stat.S_ISCHR(st.st_mode):
                        continue
                    f.unlink()
                except FileNotFoundError:
                    pass
                os.mknod(f, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        key = self.munge_dir / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)

    # ------------------------------------------------------------ processes
    def _our_pids(self) -> set[int]:
        """Processes started for this state dir: daemons (cmdline or env names
        it), slurmstepd and job processes (their env carries our SLURM_CONF)."""
        me = os.getpid()
        ancestors = set()
        p = me
        while p > 1:
            ancestors.add(p)
            try:
                p = int(_read(f"/proc/{p}/stat").rsplit(b")", 1)[1].split()[1])
            except (IndexError, ValueError):
                break
        tag_dir = str(self.state_dir).encode()
        tag_root = str(self.root).encode()
        tag_env = [b"LOOPBACK_SLURM_DIR=" + tag_dir, b"SLURM_CONF=" + str(self.conf).encode(),
                   b"SLURM_CONF=" + str(self.state_dir / "etc" / "slurm.conf").encode()]
        pids = set()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in ancestors:
                continue
            pid = int(d)
            cmd = _read(f"/proc/{d}/cmdline")
            if not cmd:
                continue
            envb = _read(f"/proc/{d}/environ").split(b"\0")
            if any(t in envb for t in tag_env) or (
                    (tag_dir in cmd or tag_root in cmd) and _read(f"/proc/{d}/comm").strip().decode() in _DAEMON_COMMS):
                pids.add(pid)
        return pids

    def _kill(self, pids, grace: float = 3.0, term_first: bool = True):
        pids = {p for p in pids if p != os.getpid()}
        for sig in ((signal.SIGTERM, signal.SIGKILL) if term_first else (signal.SIGKILL,)):
            for p in pids:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            end = time.monotonic() + grace
            while time.monotonic() < end:
                self._reap()
                pids = {p for p in pids if _pid_alive(p)}
                if not pids:
                    return
                time.sleep(0.05)
        self._reap()

    def _reap(self):
        for p in self._procs.values():
            p.poll()

    def cleanup_leftovers(self):
        """Kill processes of a previous (crashed) run of this state dir, and
        (if evict_port_holders) Slurm/munge daemons squatting on our ports."""
        # a crashed run's state is wiped anyway: SIGKILL at once
        self._kill(self._our_pids(), term_first=False)
        for pidfile in self.run_dir.glob("*.pid") if self.run_dir.exists() else ():
            try:
                pid = int(pidfile.read_text().strip())
                comm = _read(f"/proc/{pid}/comm").strip().decode()
                if comm in _DAEMON_COMMS:
                    self._kill({pid}, term_first=False)
            except (ValueError, OSError):
                pass
        busy = [p for p in self.ports if _port_in_use(p)]
        if busy and self.evict_port_holders:
            holders = set()
            for port in busy:
                for pid in _pids_holding(_listening_inodes(port)):
                    if _read(f"/proc/{pid}/comm").strip().decode() in _DAEMON_COMMS:
                        holders.add(pid)
            self._kill(holders, term_first=False)
        # TIME_WAIT sockets do not block (SO_REUSEADDR); a live listener does
        end = time.monotonic() + 5
        while True:
            busy = [p for p in self.ports if _port_in_use(p)]
            if not busy:
                return
            if time.monotonic() > end:
                raise SlurmError(f"ports {busy} are in use by other processes")
            time.sleep(0.1)

    def _spawn(self, name: str, argv: list[str]):
        logf = open(self.log_dir / f"{name}.stdout", "ab")
        self._procs[name] = subprocess.Popen(
            argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=logf,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root)
        logf.close()

    def _check_alive(self):
        for name, p in self._procs.items():
            if p.poll() is not None:
                tail = b""
                for f in (self.log_dir / f"{name}.stdout",
                          self.log_dir / ("slurmctld.log" if name == "slurmctld" else f"{name}.log")):
                    tail += _read(str(f))[-2000:]
                raise SlurmError(f"{name} exited rc={p.returncode}:\n{tail.decode(errors='replace')}")

    def node_states(self) -> dict[str, str]:
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=15)
        out = {}
        if p.returncode == 0:
            for line in p.stdout.split("\n"):
                f = line.split()
                if len(f) == 2:
                    out[f[0]] = f[1]
        return out

    def start(self):
        if os.geteuid() != 0:
            raise SlurmError("LoopbackSlurm needs root")
        t0 = time.monotonic()
        self.cleanup_leftovers()
        self._write_files()
        t1 = time.monotonic()
        m = self.munge_dir
        # --force: munged otherwise refuses a socket whose parent dirs are not
        # all o+x (pytest's tmp_path is 0700); every client here is root anyway
        munged = [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                  f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                  f"--log-file={self.log_dir}/munged.log", f"--seed-file={m}/munged.seed",
                  "--num-threads=4"]
        self._spawn("munged", munged)
        end = time.monotonic() + 10
        while not self.munge_socket.exists():
            self._check_alive()
            if time.monotonic() > end:
                raise SlurmError("munged socket did not appear")
            time.sleep(0.02)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for n in self.node_names:
            self._spawn(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
        end = time.monotonic() + self.start_timeout
        states = {}
        while time.monotonic() < end:
            self._check_alive()
            states = self.node_states()
            if len(states) == self.nodes and all(
                    s.rstrip("*~#$@^-+").lower() == "idle" for s in states.values()):
                self.timings["start_s"] = time.monotonic() - t0
                self.timings["start_daemons_s"] = time.monotonic() - t1
                return self
            time.sleep(0.1)
        self.stop()
        raise SlurmError(f"nodes not idle after {self.start_timeout}s: {states}")

    def stop(self, timeout: float = 20.0):
        """Cancel all jobs, shut the daemons down, kill whatever is left."""
        t0 = time.monotonic()
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self.run(["scancel", "--full", "--quiet", f"--partition={self.partition}"],
                     check=False, timeout=10)
            # give steps a moment to die under slurmd's control (SIGCONT/TERM/KILL)
            end = time.monotonic() + min(timeout, 8)
            while time.monotonic() < end:
                q = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                if q.returncode != 0 or not q.stdout.strip():
                    break
                time.sleep(0.1)
            self.run(["scontrol", "shutdown"], check=False, timeout=10)
        end = time.monotonic() + timeout
        slurm = [p for n, p in self._procs.items() if n != "munged"]
        while time.monotonic() < end and any(p.poll() is None for p in slurm):
            time.sleep(0.05)
        for p in slurm:
            if p.poll() is None:
                p.terminate()
        # stepds / job processes that escaped, then munged, then the rest
        self._kill(self._our_pids() - {p.pid for n, p in self._procs.items() if n == "munged"})
        mp = self._procs.get("munged")
        if mp is not None and mp.poll() is None:
            mp.terminate()
            try:
                mp.wait(5)
            except subprocess.TimeoutExpired:
                mp.kill()
        self._kill(self._our_pids() | {p.pid for p in self._procs.values() if p.poll() is None})
        for p in self._procs.values():
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        if self.short_link is not None and os.path.islink(self.short_link) \
                and os.path.realpath(self.short_link) == str(self.state_dir):
            os.unlink(self.short_link)
        self.timings["stop_s"] = time.monotonic() - t0

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -------------------------------------------------------------- helpers
    def job_processes(self) -> set[int]:
        """Live processes of this cluster's jobs (batch scripts, steps, their children), daemons excluded."""
        return {p for p in self._our_pids() if _pid_alive(p)
                and _read(f"/proc/{p}/comm").strip().decode() not in ("slurmctld", "slurmscriptd", "slurmd", "munged")}

    def job_state(self, job_id: str) -> str:
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        found = re.search(r"JobState=(\S+)", out)
        return found.group(1) if found else "gone"
