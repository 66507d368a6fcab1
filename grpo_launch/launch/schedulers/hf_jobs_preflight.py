"""The preflight of scheduler=hf-jobs (`grpo run --preflight`): two cheap CPU Jobs check, before any GPU is paid for,
what the run depends on. Standard library only: it runs as a file of the uploaded run directory in a plain Python
image, as `python3 preflight.py ROLE MOUNT BEACONS [WRITER]`.

- `writer` mounts the run directory read-write: it writes a file there, serves HTTP on PORT (`GET /seen/K`: the
  reader saw beacon K; it answers the seconds since it wrote it, on its own clock), writes BEACONS beacon files a
  second apart, and ends once the reader saw them all (or after a bound).
- `reader` mounts it read-only at the same path: a write there must fail, each beacon must appear within a bound,
  and it tells the writer through the network group (`http://WRITER:PORT`), so the Jobs reach each other.

Each prints one line `PREFLIGHT {json}` with what it found and exits 0 when every check passed.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import sys
import threading
import time
import urllib.request

PORT = 8000
VISIBLE_S = 120.0            # a beacon written by the writer must appear on the reader's mount within this
REACH_S = 300.0              # how long the reader tries to reach the writer (it may still be starting)
SUBDIR = ".preflight"


def report(**found) -> None:
    print("PREFLIGHT " + json.dumps(found), flush=True)


def writer(mount: str, beacons: int) -> int:
    folder = os.path.join(mount, SUBDIR)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "writable"), "w") as f:
        f.write("ok\n")
    written: dict[int, float] = {}
    latencies: dict[int, float] = {}
    done = threading.Event()

    class Seen(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            k = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/seen/") else -1
            if k not in written:
                self.send_error(404)
                return
            latencies[k] = time.monotonic() - written[k]
            body = json.dumps({"beacon": k, "latency_s": latencies[k]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if len(latencies) == beacons:
                done.set()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Seen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for k in range(beacons):
        path = os.path.join(folder, f"beacon-{k}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{k}\n")
        os.replace(path + ".tmp", path)
        written[k] = time.monotonic()
        print(f"wrote {path}", flush=True)
        time.sleep(1.0)
    ok = done.wait(REACH_S + VISIBLE_S)
    server.shutdown()
    report(role="writer", writable=True, beacons=beacons, seen=len(latencies),
           latency_s=[round(latencies[k], 3) for k in sorted(latencies)])
    return 0 if ok else 1


def reader(mount: str, beacons: int, writer_host: str) -> int:
    folder = os.path.join(mount, SUBDIR)
    try:
        with open(os.path.join(mount, "preflight-read-only-check"), "w"):
            pass
        read_only = False
    except OSError as e:
        read_only = e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    latencies, reached = [], False
    for k in range(beacons):
        path = os.path.join(folder, f"beacon-{k}")
        deadline = time.monotonic() + VISIBLE_S + (REACH_S if k == 0 else 0)
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.exists(path):
            print(f"beacon {k} did not appear at {path} within the bound", flush=True)
            break
        deadline = time.monotonic() + REACH_S
        while True:
            try:
                with urllib.request.urlopen(f"http://{writer_host}:{PORT}/seen/{k}", timeout=10) as response:
                    latencies.append(json.loads(response.read())["latency_s"])
                    reached = True
                    break
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"the writer at {writer_host}:{PORT} did not answer: {e}", flush=True)
                    break
                time.sleep(1.0)
        if not reached:
            break
    report(role="reader", read_only=read_only, reached_writer=reached, beacons=beacons, seen=len(latencies),
           latency_s=[round(x, 3) for x in latencies])
    return 0 if read_only and reached and len(latencies) == beacons else 1


if __name__ == "__main__":
    role, mount, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.exit(writer(mount, count) if role == "writer" else reader(mount, count, sys.argv[4]))
