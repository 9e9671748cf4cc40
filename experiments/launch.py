r"""Start one JAX process per GPU (or per group of CPU devices) on this host.

    python -m experiments.launch --processes 8 -- python -m experiments.train --config ...
    python -m experiments.launch --processes 2 --platform cpu --devices_per_process 4 -- ...
    # several hosts: the same command on each, with its --host_index
    python -m experiments.launch --processes 8 --hosts 2 --host_index 0 \
        --coordinator host0:12355 -- python -m experiments.train ...

Each child runs the command with the environment of a ``jax.distributed`` process:
``JAX_COORDINATOR_ADDRESS`` (host 0's address; on one host a free local port),
``JAX_NUM_PROCESSES`` (hosts x processes) and ``JAX_PROCESS_ID`` (host_index x processes +
local index), which :func:`experiments.sharding.maybe_initialize_distributed` passes to
``jax.distributed.initialize``. On ``gpu`` the child sees only its own GPUs
(``CUDA_VISIBLE_DEVICES``: ``devices_per_process`` consecutive ones, counted within any
``CUDA_VISIBLE_DEVICES`` the launcher was given); on ``cpu`` it gets ``devices_per_process``
host devices (``--xla_force_host_platform_device_count``), which is how the tests run several
processes on one machine.

Output: process 0's lines as they are, the others' prefixed ``[process K]``. When a child
fails, the others are stopped (a process left alone would wait in a collective forever) and
the launcher exits with that child's code; Ctrl-C stops them all. Checkpoints are written by
every process together (orbax), so a stopped run resumes from its last complete checkpoint
with any number of processes or devices.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

STOP_GRACE_S = 10  # seconds between SIGTERM and SIGKILL when stopping the children


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def local_gpus():
    """Ids of the GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else those
    ``nvidia-smi -L`` lists (none without it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, _ in enumerate(re.findall(r"^GPU \d+", listing, re.M))]


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def child_environments(*, processes, devices_per_process, platform, hosts, host_index,
                       coordinator, gpus=(), base=None):
    """The environment of each local child (list of dicts), from the launcher's options.

    ``gpus``: the GPU ids to hand out on ``gpu`` (``devices_per_process`` each, in order).
    """
    base = dict(os.environ if base is None else base)
    envs = []
    for local in range(processes):
        env = dict(base, PYTHONUNBUFFERED=base.get("PYTHONUNBUFFERED", "1"),  # lines as printed
                   JAX_COORDINATOR_ADDRESS=coordinator,
                   JAX_NUM_PROCESSES=str(hosts * processes),
                   JAX_PROCESS_ID=str(host_index * processes + local))
        if platform == "gpu":
            mine = gpus[local * devices_per_process:(local + 1) * devices_per_process]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        else:
            env["JAX_PLATFORMS"] = "cpu"
            flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                           base.get("XLA_FLAGS", "")).strip()
            env["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                f"{devices_per_process}").strip()
        envs.append(env)
    return envs


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.launch",
        description="Start one JAX process per GPU (or per CPU device group) on this host; "
                    "the command follows '--'.")
    parser.add_argument("--processes", type=int, default=None,
                        help="processes on this host (default: one per visible GPU)")
    parser.add_argument("--devices_per_process", type=int, default=1)
    parser.add_argument("--platform", choices=("gpu", "cpu"), default=None,
                        help="default: gpu when nvidia-smi lists GPUs, else cpu")
    parser.add_argument("--hosts", type=int, default=1, help="hosts taking part")
    parser.add_argument("--host_index", type=int, default=0, help="this host's index")
    parser.add_argument("--coordinator", default=None,
                        help="host:port of host 0's process 0 (required with --hosts > 1)")
    if "--" not in argv:
        _fail("no command: give it after '--', e.g. python -m experiments.launch "
              "--processes 2 -- python -m experiments.train --config configs/lra/listops.py")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1:]
    if not args.command:
        _fail("the command after '--' is empty")
    return args


def resolve(args):
    """Fills the defaults of ``args`` and checks them; returns the GPU ids (gpu) or []."""
    gpus = local_gpus()
    if args.platform is None:
        args.platform = "gpu" if gpus else "cpu"
    if args.processes is None:
        if args.platform == "cpu":
            _fail("--processes is required on cpu (e.g. --processes 2 --devices_per_process 4)")
        args.processes = len(gpus) // args.devices_per_process
    if args.processes < 1 or args.devices_per_process < 1:
        _fail(f"--processes ({args.processes}) and --devices_per_process "
              f"({args.devices_per_process}) must be at least 1")
    if args.platform == "gpu" and args.processes * args.devices_per_process > len(gpus):
        source = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in os.environ else "nvidia-smi -L"
        _fail(f"{args.processes} processes x {args.devices_per_process} GPUs need "
              f"{args.processes * args.devices_per_process} GPUs; this host has {len(gpus)} "
              f"({source}); lower --processes, or use --platform cpu")
    if args.hosts < 1 or not 0 <= args.host_index < args.hosts:
        _fail(f"--host_index {args.host_index} must lie in [0, --hosts {args.hosts})")
    if args.coordinator is None:
        if args.hosts > 1:
            _fail("--coordinator host:port is required with --hosts > 1 (host 0's address, "
                  "the same on every host)")
        args.coordinator = f"localhost:{free_port()}"
    return gpus


def _pump(stream, out, prefix):
    for line in iter(stream.readline, ""):
        out.write(prefix + line)
        out.flush()
    stream.close()


def run(args, gpus):
    """Starts the children, relays their output, returns the exit code (the first failure's,
    else 0)."""
    envs = child_environments(
        processes=args.processes, devices_per_process=args.devices_per_process,
        platform=args.platform, hosts=args.hosts, host_index=args.host_index,
        coordinator=args.coordinator, gpus=gpus)
    children, pumps = [], []
    for env in envs:
        rank = int(env["JAX_PROCESS_ID"])
        child = subprocess.Popen(args.command, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, bufsize=1)
        prefix = "" if rank == 0 else f"[process {rank}] "
        for stream, out in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            pump = threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True)
            pump.start()
            pumps.append(pump)
        children.append(child)

    def stop_all(*_):
        for child in children:
            if child.poll() is None:
                child.terminate()
        deadline = time.time() + STOP_GRACE_S
        for child in children:
            try:
                child.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                child.kill()

    signal.signal(signal.SIGTERM, lambda *_: (stop_all(), sys.exit(143)))
    code = 0
    try:
        running = list(children)
        while running:
            for child in list(running):
                rc = child.poll()
                if rc is None:
                    continue
                running.remove(child)
                if rc != 0 and code == 0:
                    code = rc
                    stop_all()
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop_all()
        code = 130
    for pump in pumps:
        pump.join(timeout=5)
    return code


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    gpus = resolve(args)
    sys.exit(run(args, gpus))


if __name__ == "__main__":
    main()
