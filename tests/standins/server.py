"""A stand-in for `vllm serve` in orchestration tests: it speaks the same health endpoint (GET /health -> 200)
and can be told to be slow, never ready, or to die. It is not vLLM and generates nothing."""

import argparse
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
parser.add_argument("--code", type=int, default=1)
parser.add_argument("--pid-dir", default=None)
parser.add_argument("--ignore-sigterm", action="store_true")
args = parser.parse_args()
start = time.monotonic()

if args.ignore_sigterm:  # before the pid file: a test that sees the file may signal at once
    signal.signal(signal.SIGTERM, lambda *_: print("stand-in server ignoring SIGTERM", flush=True))
if args.pid_dir:  # this process and a child of its own: the supervisor must stop both
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(args.pid_dir, f"server-{os.getpid()}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = not args.never_ready and time.monotonic() - start >= args.ready_after
        self.send_response(200 if self.path == "/health" and ready else 503)
        self.end_headers()

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"stand-in server listening on {args.port}", flush=True)
if args.die_after is not None:
    time.sleep(args.die_after)
    print(f"stand-in server dying with code {args.code} at {time.time():.3f}", flush=True)
    os._exit(args.code)
while True:
    time.sleep(1)
