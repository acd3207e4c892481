"""`scalerl launch --ray local|ADDRESS`: the run's roles as Ray actors, on one machine or several.

    driver (this command)                 Ray cluster
    ─────────────────────                 ───────────
    check the config (one-line errors)
    placement group: one bundle per learner rank (+ one for the async producer)
    learner actor(s) ──────────────────→  rank r: `scalerl train`'s own code path (torch.distributed over gloo or
                                          NCCL between ranks, MASTER_ADDR = rank 0's node)
                                          async: rank 0 creates the producer actor in the last bundle and reaches it
                                          over the pair link (scalerl/rollout/ray_producer.py)
    wait; SIGTERM/SIGINT → forwarded to every learner (it checkpoints and stops); exit with the ranks' code

Each actor works in this command's working directory, so `log.run_dir` and the run's metrics and
checkpoints are where `scalerl train` puts them (across machines that path must be one shared
filesystem, docs/ray.md). Nothing about training differs from `scalerl train`; Ray only places
the processes.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer

from scalerl.cli.common import launch as launch_here
from scalerl.cli.common import checked_config, command_overrides, run_guarded, setup_logging
from scalerl.errors import ScaleRLError


class LearnerActor:
    """One learner rank; made a Ray actor class by `run_on_ray` (`ray.remote(LearnerActor)`), so that this module
    imports without Ray."""

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        with socket.socket() as s:  # a free port for rank 0's process group (MASTER_PORT)
            s.bind(("", 0))
            port = s.getsockname()[1]
        context = ray.get_runtime_context()
        return {"ip": ray.util.get_node_ip_address(), "node_id": context.get_node_id(), "pid": os.getpid(), "port": port,
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def run(self, env: dict[str, str], cwd: str, config_path: str | None, overrides: list[str], resume: bool,
            overwrite: bool, debug: bool, producer: Any) -> int:
        """`scalerl train` in this actor; returns its exit code (errors were printed, and reach the driver's terminal)."""
        os.environ.update(env)
        os.chdir(cwd)
        try:
            launch_here(Path(config_path) if config_path else None, overrides, dry_run=False, resume=resume, debug=debug,
                        overwrite=overwrite, producer=producer)
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return 0


def connect(address: str, num_cpus: int | None):
    """ray.init for `--ray local` (a new single-machine cluster, every address on the loopback) or `--ray ADDRESS`
    (an existing one)."""
    if address not in ("local", "auto") and not address.startswith("ray://"):
        reachable(address)
    if address == "local":  # read when Ray is imported: otherwise Ray puts the machine's outward address for 127.0.0.1
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ScaleRLError("scalerl launch --ray needs Ray: pip install 'scalerl[ray]'") from None
    try:
        if address == "local":
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
        else:
            ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as err:
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        raise ScaleRLError(f"--ray {address}: could not join the Ray cluster ({str(err).strip().splitlines()[0]}); is its address "
                           f"right (`ray status` on the head)? A head with token authentication needs RAY_AUTH_MODE=token here "
                           f"(now {mode}) and its token (~/.ray/auth_token or RAY_AUTH_TOKEN)") from None
    return ray


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """A one-line error now for a head that is not there (ray.init would retry for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ScaleRLError(f"--ray {address}: expected local, auto, ray://HOST:PORT or HOST:PORT (a Ray head's GCS, usually port 6379)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ScaleRLError(f"--ray {address}: no Ray head answers there ({err.strerror or err}); start one with "
                           f"`ray start --head --port {port}`, or use --ray local") from None


def reserve(ray, bundles: list[dict[str, float]], strategy: str, wait_s: float):
    """The placement group of the run's roles, or a one-line error naming what the cluster lacks."""
    from ray.util.placement_group import placement_group

    group = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=wait_s)
    if not ready:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)
        have = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        raise ScaleRLError(f"the Ray cluster cannot place the run's roles {bundles} ({strategy}) within {wait_s:.0f} s; it has "
                           f"{have}: lower --learner-cpus/--rollout-cpus/--nproc, or add nodes")
    return group


def rank_envs(places: list[dict[str, Any]]) -> list[dict[str, str]]:
    """torchrun's environment for each learner rank, from where Ray put them (rank 0's node hosts the process group)."""
    world = len(places)
    envs = []
    for rank, place in enumerate(places):
        same_node = [p for p in places if p["node_id"] == place["node_id"]]
        local_rank = same_node.index(place)
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
               "LOCAL_WORLD_SIZE": str(len(same_node)), "MASTER_ADDR": places[0]["ip"], "MASTER_PORT": str(places[0]["port"])}
        if place["gpus"]:  # Ray shows each actor only its own GPU(s): the rank's device is cuda:0 of what it sees
            env["LOCAL_RANK"] = "0"
        envs.append(env if world > 1 else {})
    return envs


def send_signal(pid: int, signum: int) -> None:
    os.kill(pid, signum)


class ForwardSignals:
    """SIGTERM/SIGINT at the driver: sent on to every learner process (a Ray task on its node), which finishes its
    step, checkpoints and stops; a second one kills the actors."""

    def __init__(self, ray, places: list[dict[str, Any]], actors: list[Any]):
        self.ray, self.places, self.actors, self.count = ray, places, actors, 0
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame) -> None:
        self.count += 1
        if self.count > 1:
            for actor in self.actors:
                self.ray.kill(actor)
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        send = self.ray.remote(num_cpus=0)(send_signal)
        for place in self.places:
            send.options(scheduling_strategy=NodeAffinitySchedulingStrategy(place["node_id"], soft=False)).remote(place["pid"], signum)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def run_on_ray(address: str, config_path: Path | None, overrides: list[str], *, resume: bool, overwrite: bool, debug: bool,
               nproc: int, resources: dict[str, float], strategy: str, num_cpus: int | None) -> int:
    """Check the config, place the roles, run them, and return the exit code of the ranks."""
    config = checked_config(config_path, overrides, resume, overwrite)
    asynchronous = config.rollout.mode == "async"
    if asynchronous and nproc > 1:
        raise ScaleRLError("--nproc > 1 with rollout.mode=async: an async run has one learner rank for now (and its producer "
                           "actor); use --nproc 1, or rollout.mode=sync for several ranks")
    ray = connect(address, num_cpus)
    learner = {"CPU": resources["learner_cpus"], **({"GPU": resources["learner_gpus"]} if resources["learner_gpus"] else {})}
    producer = {"CPU": resources["rollout_cpus"], **({"GPU": resources["rollout_gpus"]} if resources["rollout_gpus"] else {})}
    group = reserve(ray, [learner] * nproc + ([producer] if asynchronous else []), strategy, wait_s=120)
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from scalerl.rollout.ray_producer import RayProducer

    actor_class = ray.remote(LearnerActor)
    actors = [actor_class.options(num_cpus=learner["CPU"], num_gpus=learner.get("GPU", 0), name=f"scalerl-learner-{rank}-{os.getpid()}",
                                  scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)).remote()
              for rank in range(nproc)]
    places = ray.get([a.where.remote() for a in actors])
    for rank, place in enumerate(places):
        print(f"ray: learner rank {rank} on node {place['ip']} (pid {place['pid']}"
              f"{', GPU ' + ','.join(place['gpus']) if place['gpus'] else ''})", file=sys.stderr)
    rollout = (RayProducer(group, nproc, producer["CPU"], producer.get("GPU", 0), host=places[0]["ip"]) if asynchronous else None)
    cwd, path = str(Path.cwd()), str(config_path.resolve()) if config_path else None
    results = [a.run.remote(env, cwd, path, overrides, resume, overwrite, debug, rollout if rank == 0 else None)
               for rank, (a, env) in enumerate(zip(actors, rank_envs(places)))]
    forward = ForwardSignals(ray, places, actors)
    try:
        return wait_for(ray, results)
    finally:
        forward.restore()
        for actor in actors:
            ray.kill(actor)
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)


def wait_for(ray, results: list[Any]) -> int:
    """The ranks' exit code: the first non-zero one, 1 when an actor died (its node lost, killed)."""
    codes = []
    pending = list(results)
    while pending:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            try:
                codes.append(ray.get(ref))
            except ray.exceptions.RayError as err:  # a failure in the actor (cause: its exception), or the actor lost
                cause = getattr(err, "cause", None)
                what = f"{type(cause).__name__}: {cause}" if cause is not None else str(err).strip().splitlines()[0]
                print(f"error: a learner actor died: {what}", file=sys.stderr)
                codes.append(1)
    time.sleep(0.5)  # the actors' last lines reach this terminal through Ray's log monitor
    return next((c for c in codes if c), 0)


def launch(
    ray_address: str = typer.Option(..., "--ray", help="local: start a Ray cluster on this machine; ADDRESS: join a running one (host:6379, or auto)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of overrides of the defaults."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key, e.g. --set rollout.mode=async (repeatable)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name: the run directory is <log.run_dir>/<name>."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Shorthand for --set train.steps=N."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run named by --name from its newest intact checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete what the run folder of --name holds and start afresh."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Learner ranks (rollout.mode=sync), each a Ray actor; torch.distributed joins them."),
    learner_cpus: float = typer.Option(1.0, "--learner-cpus", min=0.01, help="CPUs of each learner actor (its torch threads)."),
    learner_gpus: float = typer.Option(0.0, "--learner-gpus", min=0.0, help="GPUs of each learner actor."),
    rollout_cpus: float = typer.Option(1.0, "--rollout-cpus", min=0.01, help="rollout.mode=async: CPUs of the producer actor."),
    rollout_gpus: float = typer.Option(0.0, "--rollout-gpus", min=0.0, help="rollout.mode=async: GPUs of the producer actor."),
    strategy: str = typer.Option("PACK", "--strategy", help="Ray placement strategy of the roles: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", min=1, help="--ray local: CPUs of the new cluster (default: all cores)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Run `scalerl train` with its roles as Ray actors: learner rank(s), and the async producer (docs/ray.md)."""
    overrides = command_overrides(set_, name, steps)
    resources = {"learner_cpus": learner_cpus, "learner_gpus": learner_gpus, "rollout_cpus": rollout_cpus, "rollout_gpus": rollout_gpus}
    code: list[int] = []

    def go() -> None:
        if strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ScaleRLError(f"--strategy {strategy}: choose PACK, SPREAD, STRICT_PACK or STRICT_SPREAD")
        code.append(run_on_ray(ray_address, config, overrides, resume=resume, overwrite=overwrite, debug=debug, nproc=nproc,
                               resources=resources, strategy=strategy, num_cpus=num_cpus))

    setup_logging()
    run_guarded(go, debug)
    raise SystemExit(code[0] if code else 0)
