"""Where the CPU of a benchmark round went, from py-spy's raw stacks (``bench_gateway.py
--profile``): CPU milliseconds per request by process, by thread of one process (pearld unless
told), and by package and function on one of its threads.

    python scripts/pyspy_summary.py DIR/gateway-1.txt [...] --requests 256 --rate 200
                                    [--process pearld] [--thread gateway] [--top 25]

py-spy's raw format is one stack a line, root first, ``;``-separated, then the sample count:
``process PID:"CMD";...;thread (TID): NAME;func (file:line);... N`` (``--subprocesses
--threads``). A sample is 1/rate seconds of one thread py-spy took for running, so samples x
1000 / rate / requests is ms per request. A process is named by its command line: the agents
(multiprocessing's spawn), pearld (the benchmark, which embeds it), worker hosts (forked by
``actors.forkserver``), worker servers (``pearl.engines.facade``), the pass-through proxy,
sglang-router (its /proc figure only: py-spy samples no Rust). Left out: samples of a process's
start-up (imports: not per-request work) and of a thread waiting (:data:`WAITING`: py-spy does
not tell every waiting thread idle). py-spy drops samples on a loaded machine and counts a
runnable thread waiting for a core: its absolute figures are not CPU; its shares within a
process are what it gives. Several files add up (rounds of one way). Where ``X.cpu.json`` lies
beside ``X.txt`` (each process's CPU seconds in the round, from /proc), the exact CPU ms per
request by process come first.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

KINDS = (  # (what the command line holds, the process's name), first match wins
    ("spawn_main", "agents"),
    ("passthrough.py", "proxy"),
    ("actors.forkserver", "worker hosts"),
    ("pearl.engines.facade", "worker servers"),
    ("bench_", "pearld"),
    ("sglang::router", "sglang-router"),
)
START_UP = ("_find_and_load", "_fixup_main_from_path")
# Leaf frames of a thread that waits: py-spy does not tell these threads idle in every process
# (a forked worker host, a thread blocked in a lock or a ZeroMQ poll), so they are left out.
WAITING = (
    "select",
    "poll",
    "wait",
    "sleep",
    "accept",
    "readinto",
    "recv",
    "recv_multipart",
    "_recv_msg",
    "_acquire_restore",
    "acquire",
    "Queue.get",
    "_worker",
    "ForkServer._read",
)
LINE = re.compile(r":\d+\)$")
TID = re.compile(r"\((?:0x)?[0-9a-f]+\)")
NUMBERED = re.compile(r"(-\d+|_\d+| worker/\d+)$")


def kind_of(process: str) -> str:
    return next((name for key, name in KINDS if key in process), "other")


def package(frame: str) -> str:
    """The top-level package (or stdlib module) of a ``func (file:line)`` frame."""
    where = frame.rsplit(" (", 1)[-1].rstrip(")")
    path = where.rsplit(":", 1)[0]
    if path.startswith("<"):
        return path
    parts = Path(path).parts
    if parts and parts[0] in ("pearl", "actors", "transports") and len(parts) > 2:
        return "/".join(parts[:2])  # pearl/gateway, pearl/engines, ...
    return parts[0].removesuffix(".py") if parts else path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--requests", type=int, required=True, help="requests the rounds served")
    ap.add_argument("--rate", type=int, required=True, help="py-spy's samples per second")
    ap.add_argument("--process", default="pearld", help="the process to break down by thread")
    ap.add_argument("--thread", default="gateway", help="its thread to break down")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    ms = 1000.0 / a.rate / a.requests  # CPU ms per request of one sample
    procs: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    exact: Counter[str] = Counter()
    for path in a.files:
        cpu = Path(path).with_suffix(".cpu.json")
        if cpu.exists():
            for p in json.loads(cpu.read_text()).values():
                exact[kind_of(p["cmd"])] += p["cpu_s"]
        for line in Path(path).read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")
            if any(f.startswith(START_UP) for f in frames):
                continue
            name = frames[-1].rsplit(" (", 1)[0]  # Class.method (file:line) -> Class.method
            if name in WAITING or name.rsplit(".", 1)[-1] in WAITING:
                continue
            count = int(n)
            total += count
            at = max((i for i, f in enumerate(frames) if f.startswith("process ")), default=-1)
            kind = kind_of(frames[at]) if at >= 0 else a.process  # one process sampled
            procs[kind] += count
            th = next((f for f in frames if f.startswith("thread (")), "thread (0): ?")
            name = NUMBERED.sub("", th.split(": ", 1)[-1])
            if kind != a.process:
                continue
            threads[name] += count
            if name != a.thread:
                continue
            code = [f for f in frames[at + 1 :] if not f.startswith("thread (")]
            if code:
                leaf[package(code[-1])] += count
            for f in {LINE.sub(")", f) for f in code}:
                inclusive[f] += count
    if exact:
        print(
            f"CPU ms per request, by process (/proc): {sum(exact.values()) * 1e3 / a.requests:.2f}"
        )
        for k, v in exact.most_common():
            print(f"  {v * 1e3 / a.requests:7.2f}  {k}")
    print(f"{total} samples, {total * ms:.2f} CPU ms per request in all")
    print("CPU ms per request, by process:")
    for k, v in procs.most_common():
        print(f"  {v * ms:7.2f}  {k}")
    print(f"{a.process}, by thread:")
    for k, v in threads.most_common():
        print(f"  {v * ms:7.2f}  {k}")
    print(f"{a.process}'s {a.thread!r} thread, by the package running (leaf frame):")
    for k, v in leaf.most_common(a.top):
        print(f"  {v * ms:7.2f}  {k}")
    print(f"{a.process}'s {a.thread!r} thread, functions inclusive (with what they call):")
    for k, v in inclusive.most_common(a.top):
        print(f"  {v * ms:7.2f}  {k}")


if __name__ == "__main__":
    main()
