"""A stand-in trainer for orchestration tests: checks its server is healthy when it starts, runs for a while (or
until a number of server incarnations have started), prints what it is told to, exits with a chosen code. It is not
a trainer and trains nothing."""

import argparse
import glob
import os
import subprocess
import sys
import time
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--url", default=None)
parser.add_argument("--run-for", type=float, default=0.5)
parser.add_argument("--until-started", nargs=2, metavar=("PID_DIR", "N"), default=None,
                    help="run until PID_DIR holds N stand-in servers' files (incarnations), at most 120 s")
parser.add_argument("--until-probed", nargs=2, metavar=("SERVER", "N"), default=None,
                    help="run until the stand-in server at SERVER (http://host:port) was probed N times by the "
                         "supervisor, at most 120 s")
parser.add_argument("--long-line", type=int, default=0, help="print a progress bar of this many bytes, redrawn "
                                                            "with \\r, before its newline")
parser.add_argument("--print-bytes", type=int, default=0, help="print this many bytes of ordinary lines")
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
    print("stand-in trainer recorded its pids", flush=True)
if args.long_line:
    bar = "\r 50%|█████     | 5/10 [00:01<00:01,  8.90it/s]"
    sys.stdout.write((bar * (args.long_line // len(bar.encode()) + 1)) + "\n")
    print("stand-in trainer after the long line", flush=True)
if args.print_bytes:
    line = "x" * 99
    for _ in range(args.print_bytes // 100 + 1):
        print(line)
    print(f"stand-in trainer printed {args.print_bytes} bytes", flush=True)
if args.until_probed:
    server, count = args.until_probed[0], int(args.until_probed[1])
    deadline = time.monotonic() + 120
    while int(urllib.request.urlopen(f"{server}/probes", timeout=5).read()) < count:
        if time.monotonic() > deadline:
            print(f"stand-in trainer: {server} was not probed {count} times in 120 s", flush=True)
            sys.exit(4)
        time.sleep(0.05)
    print(f"stand-in trainer saw {server} probed {count} times", flush=True)
elif args.until_started:
    pid_dir, count = args.until_started[0], int(args.until_started[1])
    deadline = time.monotonic() + 120
    while len(glob.glob(os.path.join(pid_dir, "server-*"))) < count:
        if time.monotonic() > deadline:
            print(f"stand-in trainer: fewer than {count} servers started in 120 s", flush=True)
            sys.exit(4)
        time.sleep(0.05)
    print(f"stand-in trainer saw {count} servers start", flush=True)
else:
    for _ in range(int(args.run_for * 10)):
        time.sleep(0.1)
print(f"stand-in trainer done, exit {args.code}", flush=True)
sys.exit(args.code)
