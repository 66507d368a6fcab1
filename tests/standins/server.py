"""A stand-in for `vllm serve` in orchestration tests: it speaks the same health endpoint (GET /health -> 200)
and can be told to be slow, never ready, to die or to stop answering, on a timer or after the supervisor has probed
it a number of times (its probes say `User-Agent: grpo-launch`), so a test orders its events by what the supervisor
did, not by the clock. It is not vLLM and generates nothing."""

import argparse
import glob
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--ready-after", type=float, default=0.0)
parser.add_argument("--never-ready", action="store_true")
parser.add_argument("--die-after", type=float, default=None)
parser.add_argument("--die-after-probes", type=int, default=None, help="die once it answered the supervisor's "
                    "N-th probe with 200 (the first is the readiness probe: from the second on it was ready)")
parser.add_argument("--wedge-after-probes", type=int, default=None, help="once it answered the supervisor's N-th "
                    "probe with 200, stay alive but never answer again")
parser.add_argument("--degrade-after-probes", type=int, default=None, help="once it answered the supervisor's "
                    "N-th probe with 200, answer 503 (alive, not healthy: the proxy while a replica restarts)")
parser.add_argument("--deaths", type=int, default=None, help="die or wedge in the first K incarnations only "
                                                             "(counted by their files in --pid-dir)")
parser.add_argument("--report-earlier", action="store_true", help="say which processes of the earlier "
                                                                  "incarnations (their files in --pid-dir) live")
parser.add_argument("--code", type=int, default=1)
parser.add_argument("--pid-dir", default=None)
parser.add_argument("--ignore-sigterm", action="store_true")
args = parser.parse_args()
start = time.monotonic()


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


incarnation = 1
if args.ignore_sigterm:  # before the pid file: a test that sees the file may signal at once
    signal.signal(signal.SIGTERM, lambda *_: print("stand-in server ignoring SIGTERM", flush=True))
if args.pid_dir:  # this process and a child of its own: the supervisor must stop both
    earlier = sorted(glob.glob(os.path.join(args.pid_dir, "server-*")))
    if args.report_earlier:
        pids = [int(p) for path in earlier for p in open(path).read().split()]
        print(f"stand-in server: earlier incarnations' processes alive: {[p for p in pids if alive(p)]}", flush=True)
    incarnation = len(earlier) + 1
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(args.pid_dir, f"server-{os.getpid()}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
mortal = args.deaths is None or incarnation <= args.deaths
answered = 0                   # the supervisor's probes answered 200
probed = 0                     # the supervisor's probes, whatever the answer (GET /probes tells)
wedged = threading.Event()


def die() -> None:
    print(f"stand-in server dying with code {args.code} at {time.time():.3f}", flush=True)
    os._exit(args.code)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global answered, probed
        if wedged.is_set():
            threading.Event().wait()  # alive, never answering
        if self.path == "/probes":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(str(probed).encode())
            return
        supervisor = self.headers.get("User-Agent") == "grpo-launch"
        probed += supervisor
        degraded = args.degrade_after_probes is not None and answered >= args.degrade_after_probes
        ready = not args.never_ready and time.monotonic() - start >= args.ready_after and not degraded
        self.send_response(200 if self.path == "/health" and ready else 503)
        self.end_headers()
        if not (ready and self.path == "/health" and supervisor and mortal):
            return
        answered += 1
        if answered == args.die_after_probes:
            self.wfile.flush()
            die()
        if answered == args.wedge_after_probes:
            print("stand-in server no longer answering", flush=True)
            wedged.set()

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"stand-in server listening on {args.port}", flush=True)
if args.die_after is not None:
    time.sleep(args.die_after)
    die()
while True:
    time.sleep(1)
