"""The cluster testbed: H hosts as network namespaces on one machine, each with its own shaped
link into one bridge, G ranks per host talking over the host's own loopback, launched as a
multi-node torchrun launches them (one agent per host, c10d rendezvous on host 0).

    scripts/cluster.sh run --hosts 2 --ranks-per-host 2 --rate 1gbit --delay 50us \\
        --out DIR -- -m commsched.bench.compare --model profile:PROFILE?k=64 ...
    scripts/cluster.sh down            # removes a testbed a killed run left behind

Note [The testbed's network]
A switch namespace holds a bridge; each host namespace holds one end of a veth pair whose other
end is a port of that bridge, with the host's address on it. The host's link is shaped in both
directions: egress of the host's end (what it sends) and egress of the bridge's port (what it
receives), each with netem (delay, loss) over a token bucket (rate), so a host's link is the
bottleneck of every transfer in or out of it, as a node's NIC is on a cluster. Ranks on one host
reach each other at the host's own address, which Linux routes over that namespace's loopback:
unshaped, or shaped to the stated rate of the testbed's NVLink. Everything lives in namespaces
the testbed creates and deletes; the root namespace is not touched.

The rendezvous store runs in host 0's agent (is_host=1; the others are told is_host=0, since
c10d recognises its own host by the machine's host name, which every namespace shares), and each
agent names its own address (--local-addr), which torchrun hands the workers as MASTER_ADDR.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import IO

from commsched.bench.cpu_meter import CPU_BOUND, CpuMeter

DEFAULT_PREFIX = "cstb"
LOOPBACK_MTU = 65536


class ClusterError(RuntimeError):
    """The testbed cannot start, or its job failed."""


@dataclass(frozen=True)
class LinkShape:
    """How one link is shaped: rate (a tc rate, e.g. "1gbit"; None: unshaped), netem delay
    ("50us") and loss ("1%")."""

    rate: str | None = None
    delay: str = ""
    loss: str = ""

    def commands(self, namespace: str, device: str, mtu: int) -> list[list[str]]:
        """The tc commands that shape the egress of `device` (of `mtu`) in `namespace`."""
        tc = ["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device]
        netem = [*(["delay", self.delay] if self.delay else []),
                 *(["loss", self.loss] if self.loss else [])]
        out: list[list[str]] = []
        parent = ["root"]
        if netem:
            # The limit is in packets: netem's default of 1000 drops bursts of a fast link.
            out.append([*tc, "root", "handle", "1:", "netem", *netem, "limit", "100000"])
            parent = ["parent", "1:1"]
        if self.rate:
            out.append([*tc, *parent, "handle", "10:", "tbf", "rate", self.rate,
                        "burst", bucket(self.rate, mtu), "latency", "100ms"])
        return out


def rate_bits(rate: str) -> float:
    """A tc rate ("1gbit", "500mbit", "100kbit", "8bit") in bits per second.

    Raises:
        ValueError: not a rate in bits.
    """
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for suffix, factor in units.items():
        if rate.endswith(suffix) and rate[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(rate[: -len(suffix)]) * factor
    raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 10gbit, 500mbit")


def bucket(rate: str, mtu: int) -> str:
    """The token bucket for `rate` on a device of `mtu`: a millisecond of traffic, and at least
    two packets (tbf drops any packet larger than its bucket). A larger bucket would let a burst
    after an idle gap leave at memory speed (Note [The bucket's free burst] in
    scripts/netem.sh)."""
    return f"{max(int(rate_bits(rate) / 8 / 1000), 2 * mtu)}b"


@dataclass(frozen=True)
class ClusterPlan:
    """The namespaces, links and agents of one testbed (Note [The testbed's network])."""

    hosts: int
    ranks_per_host: int
    link: LinkShape
    local: LinkShape = field(default_factory=LinkShape)
    prefix: str = DEFAULT_PREFIX
    subnet: str = "10.213.0"  # the hosts are .1, .2, ...
    mtu: int = 9000
    port: int = 29400

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= 250 or self.ranks_per_host < 1:
            raise ValueError(f"a testbed of {self.hosts} hosts x {self.ranks_per_host} ranks: "
                             "hosts must be 1-250, ranks per host at least 1")

    @property
    def needs_netem(self) -> bool:
        return any(s.delay or s.loss for s in (self.link, self.local))

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def host(self, index: int) -> str:
        return f"{self.prefix}-h{index}"

    def address(self, index: int) -> str:
        return f"{self.subnet}.{index + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(self.host(h) for h in range(self.hosts))]

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    def setup(self) -> list[list[str]]:
        """Every command that builds the testbed, in order."""
        sw = self.switch
        out = [["ip", "netns", "add", sw], ["ip", "-n", sw, "link", "set", "lo", "up"],
               ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
               ["ip", "-n", sw, "link", "set", "br0", "up"]]
        for h in range(self.hosts):
            ns, port = self.host(h), f"p{h}"
            out += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                    ["ip", "-n", sw, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                     "peer", "name", "eth0", "mtu", str(self.mtu), "netns", ns],
                    ["ip", "-n", sw, "link", "set", port, "master", "br0"],
                    ["ip", "-n", sw, "link", "set", port, "up"],
                    ["ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth0"],
                    ["ip", "-n", ns, "link", "set", "eth0", "up"],
                    *self.link.commands(ns, "eth0", self.mtu),
                    *self.link.commands(sw, port, self.mtu),
                    *self.local.commands(ns, "lo", LOOPBACK_MTU)]
        return out

    def teardown(self) -> list[list[str]]:
        """The commands that remove the testbed (a namespace's links go with it)."""
        return [["ip", "netns", "delete", ns] for ns in reversed(self.namespaces)]

    def agent(self, index: int, job: Sequence[str], run_id: str) -> list[str]:
        """Host `index`'s torchrun agent for `job` (a script and its arguments, or ``-m
        module ...``), run inside the host's namespace."""
        script = ["--module", *job[1:]] if job and job[0] == "-m" else list(job)
        return ["ip", "netns", "exec", self.host(index), sys.executable, "-m",
                "torch.distributed.run", f"--nnodes={self.hosts}",
                f"--nproc-per-node={self.ranks_per_host}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.address(0)}:{self.port}", f"--rdzv-id={run_id}",
                f"--rdzv-conf=is_host={1 if index == 0 else 0}",
                f"--local-addr={self.address(index)}", "--max-restarts=0", *script]


def existing_namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise ClusterError(f"testbed: {' '.join(command)} failed: {done.stderr.strip()}")


def tear_down(plan: ClusterPlan) -> None:
    """Kills what runs in the testbed's namespaces and deletes them; quiet about what is gone."""
    present = existing_namespaces()
    for ns in plan.namespaces:
        if ns not in present:
            continue
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for command in plan.teardown():
        if command[-1] in present:
            subprocess.run(command, capture_output=True, timeout=30)


@contextmanager
def cluster(plan: ClusterPlan) -> Iterator[ClusterPlan]:
    """Builds the testbed, yields it, and tears it down on exit, on failure and on SIGINT or
    SIGTERM.

    Raises:
        ClusterError: a namespace of the testbed's name exists already, or a command failed.
    """
    clash = sorted(existing_namespaces() & set(plan.namespaces))
    if clash:
        raise ClusterError(f"testbed: namespace(s) {', '.join(clash)} exist already (another "
                           f"testbed, or one a killed run left): remove them with "
                           f"scripts/cluster.sh down --prefix {plan.prefix}")

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        commands = plan.setup()
        for command in commands[:2]:  # the switch's namespace and its loopback
            _run(command)
        if plan.needs_netem:
            _check_netem(plan.switch)
        for command in commands[2:]:
            _run(command)
        yield plan
    finally:
        tear_down(plan)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _check_netem(namespace: str) -> None:
    """Raises ClusterError where the kernel has no netem qdisc (a delay or a loss needs it)."""
    probe = ["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "lo", "root",
             "netem", "delay", "1us"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise ClusterError("testbed: a link delay or loss needs the kernel's netem qdisc "
                           f"(sch_netem), which this kernel lacks ({done.stderr.strip()}); "
                           "shape the links by rate only (no --delay, no --loss)")
    subprocess.run(probe[:6] + ["del", "dev", "lo", "root"], capture_output=True, timeout=30)


def sent_bytes(plan: ClusterPlan, device: str) -> list[int]:
    """What each host has sent on `device` ("eth0": its link; "lo": to its own ranks)."""
    out = []
    for h in range(plan.hosts):
        shown = subprocess.run(["ip", "-n", plan.host(h), "-s", "-j", "link", "show", device],
                               capture_output=True, text=True, check=True, timeout=30)
        out.append(int(json.loads(shown.stdout)[0]["stats64"]["tx"]["bytes"]))
    return out


@dataclass
class JobResult:
    returncodes: list[int]
    outputs: list[str]  # each agent's stdout and stderr
    seconds: float
    cpu_busy: float
    link_bytes: list[int]  # what each host sent over its link during the job
    local_bytes: list[int]  # ... and to its own ranks, over its loopback

    @property
    def cpu_bound(self) -> bool:
        return self.cpu_busy >= CPU_BOUND


def launch(plan: ClusterPlan, job: Sequence[str], timeout: float,
           env: dict[str, str] | None = None) -> JobResult:
    """Runs `job` on every host of a built testbed, one torchrun agent per host.

    Raises:
        ClusterError: an agent failed (the others are stopped then), or the job ran past
            `timeout` seconds; the message holds each agent's last output.
    """
    run_id = f"{plan.prefix}-{os.getpid()}-{int(time.time())}"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    link_before, local_before = sent_bytes(plan, "eth0"), sent_bytes(plan, "lo")
    meter, started = CpuMeter(), time.monotonic()
    logs: list[IO[bytes]] = []
    agents = []
    for h in range(plan.hosts):
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        logs.append(log)
        agents.append(subprocess.Popen(plan.agent(h, job, run_id), stdout=log,
                                       stderr=subprocess.STDOUT, env=full_env,
                                       start_new_session=True))
    failed = ""
    try:
        while any(a.poll() is None for a in agents):
            if time.monotonic() - started > timeout:
                failed = f"the job ran past {timeout:.0f} s"
                break
            bad = [h for h, a in enumerate(agents) if a.returncode not in (None, 0)]
            if bad:
                # Let the others see the failure and exit on their own first.
                grace = time.monotonic() + 30
                while time.monotonic() < grace and any(a.poll() is None for a in agents):
                    time.sleep(0.2)
                failed = f"host {bad[0]}'s agent exited with status {agents[bad[0]].returncode}"
                break
            time.sleep(0.2)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    outputs = []
    for written in logs:
        written.seek(0)
        outputs.append(written.read().decode(errors="replace"))
        written.close()
    result = JobResult([a.returncode for a in agents], outputs, time.monotonic() - started,
                       meter.busy(),
                       [b - a for a, b in zip(link_before, sent_bytes(plan, "eth0"), strict=True)],
                       [b - a for a, b in zip(local_before, sent_bytes(plan, "lo"), strict=True)])
    if failed or any(result.returncodes):
        tails = "\n".join(f"--- host {h}:\n{out[-3000:]}" for h, out in enumerate(outputs))
        raise ClusterError(f"testbed: {failed or 'an agent failed'}\n{tails}")
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="build a testbed, run a job on it, tear it down")
    run.add_argument("--hosts", type=int, required=True)
    run.add_argument("--ranks-per-host", type=int, required=True)
    run.add_argument("--rate", required=True, help="each host's link, as tc writes it (10gbit)")
    run.add_argument("--delay", default="", help="each host link's one-way delay (netem: 50us)")
    run.add_argument("--loss", default="", help="each host link's packet loss (netem: 1%%)")
    run.add_argument("--local-rate", default=None,
                     help="the ranks of one host talk at this rate (the NVLink); unshaped if unset")
    run.add_argument("--timeout", type=float, default=1800)
    run.add_argument("--prefix", default=DEFAULT_PREFIX)
    run.add_argument("--out", default="", help="write testbed.json (the plan, CPU use) here")
    run.add_argument("job", nargs=argparse.REMAINDER,
                     help="after --: the script and its arguments, or -m module ...")
    down = sub.add_parser("down", help="remove a testbed's namespaces")
    down.add_argument("--prefix", default=DEFAULT_PREFIX)
    down.add_argument("--hosts", type=int, default=250, help="hosts to look for")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "down":
        tear_down(ClusterPlan(args.hosts, 1, LinkShape(), prefix=args.prefix))
        return 0
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        print("testbed: no job given (after --)", file=sys.stderr)
        return 2
    plan = ClusterPlan(args.hosts, args.ranks_per_host, LinkShape(args.rate, args.delay, args.loss),
                       LinkShape(args.local_rate), prefix=args.prefix)
    try:
        with cluster(plan):
            result = launch(plan, job, args.timeout)
    except ClusterError as err:
        print(err, file=sys.stderr)
        return 1
    print(result.outputs[0], end="")
    pace = "CPU-bound: not a speed result" if result.cpu_bound else \
        f"below {CPU_BOUND:.0%}: the CPU did not set the pace"
    print(f"testbed: {plan.hosts} hosts x {plan.ranks_per_host} ranks, link {args.rate}"
          f"{' ' + args.delay if args.delay else ''}, {result.seconds:.0f} s, cores busy "
          f"{result.cpu_busy:.0%} ({pace}); sent over the links "
          f"{sum(result.link_bytes) / 1e6:.1f} MB, within hosts {sum(result.local_bytes) / 1e6:.1f}"
          " MB", file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "testbed.json"), "w", encoding="utf-8") as handle:
            json.dump({"plan": asdict(plan), "job": job, "seconds": result.seconds,
                       "cpu_busy": result.cpu_busy, "cpu_bound": result.cpu_bound,
                       "link_bytes": result.link_bytes, "local_bytes": result.local_bytes},
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
