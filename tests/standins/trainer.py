"""A stand-in trainer for orchestration tests: checks its server is healthy when it starts, runs for a while,
exits with a chosen code. It is not a trainer and trains nothing."""

import argparse
import os
import subprocess
import sys
import time
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--url", default=None)
parser.add_argument("--run-for", type=float, default=0.5)
parser.add_argument("--code", type=int, default=0)
parser.add_argument("--pid-dir", default=None)
args = parser.parse_args()

if args.url:
    try:
        status = urllib.request.urlopen(args.url, timeout=2).status
    except Exception as e:
        print(f"server not healthy at trainer start: {e}", flush=True)
        sys.exit(3)
    print(f"server health {status} at trainer start", flush=True)
if args.pid_dir:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(args.pid_dir, f"trainer-{os.getpid()}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
for _ in range(int(args.run_for * 10)):
    time.sleep(0.1)
print(f"stand-in trainer done, exit {args.code}", flush=True)
sys.exit(args.code)
