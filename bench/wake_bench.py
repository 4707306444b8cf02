"""Scale-to-zero wake benchmark on the real node (`make bench-wake`): where the seconds of a wake
go, from a request held by the router to its first token.

The chart is installed as a user installs it (operator and router pods, images imported into the
real node); one autoscaled LLMDeployment with `minReplicas: 0` and `scaleToZero.idleSeconds: 10`
idles to zero, then one streaming request is sent through the router's Service and the moments of
`tests/support/wake.py` are taken (scale patched, pod created, pod scheduled, engine started,
engine Ready, first token, answered), each as seconds after the request was sent.

`--engine simulator` (the default) serves the simulator image; `--load-seconds` is its model load
time (what an engine spends loading weights; a real model takes from seconds to minutes, which
adds to "engine Ready" only). `--engine vllm-cpu` serves vLLM's CPU build (the ~6 GB engine-cpu
image, built or reused from the cache and imported, `make image-engine-cpu`) with the tiny
random model the real-engine tests make: what a real engine's start adds. With `--compile-cache
off|on|both` (vllm-cpu only) the model comes from the local Hub stand-in into a model cache
(`spec.model.cache`) instead of a hostPath volume, with the persistent compile cache off, on, or
both side by side in one run (off first: the cold rows; then on, whose first start compiles and
publishes and whose wakes reuse it). `--wakes` runs the cycle (idle to zero, wake) that many
times and prints each wake and the median. `--image-pull both` (simulator) adds what an image
pull costs and what `spec.scheduling.prePullImage` saves: the engine image is pushed, with every
layer salted (new digests, so nothing of it is on the node), to a loopback registry
(`e2e/cluster/build-registry.sh`) and served from there; rows `on node` (the image imported, as
in every other row), `pulled` (the image removed from the node before each wake: the wake pulls
it, as a node that never ran it does) and `pre-pulled` (the same registry image with the pre-pull
DaemonSet, which pulled it while the model idled at zero). Needs the real node (root, Linux): it
starts its own cluster. `--cpu 250m 1` (simulator) runs a row per engine container CPU size
(request and limit): the limit's CFS quota paces the agent's and the engine's Python start.
Prints a table per step and per engine phase; not a test.

    python bench/wake_bench.py [--wakes 3] [--load-seconds 5] [--engine vllm-cpu]
        [--compile-cache off|on|both] [--image-pull both] [--cpu 250m 1]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from engine import real_vllm  # noqa: E402
from support import tiny_model  # noqa: E402
from support.cluster import create_namespace  # noqa: E402
from support.helm_release import NODE_IMAGE_VALUES, chart_on_real_node  # noqa: E402
from support.hub_standin import HubRepo, HubStandin  # noqa: E402
from support.realnode import (  # noqa: E402
    NODE_CONTAINERD,
    RealCluster,
    create_cache_volume,
    create_model_volume,
    delete_model_volume,
    import_into_node,
    operator_on_real_node,
    service_url,
    vllm_cpu_spec,
)
from support.wake import (  # noqa: E402
    COLUMNS,
    ENGINE_PHASES,
    describe,
    engine_phases,
    from_zero,
    one_wake,
)

SAMPLE = REPO_ROOT / "examples" / "simulator-small.yaml"
NAME = "sleepy"


Mode = bool | str | None
"""A row's setup: None (the default), the compile cache off/on (False/True), or an image mode
("pulled", "pre-pulled")."""


def name_of(mode: Mode, cpu: str | None = None) -> str:
    """Each mode's (and CPU size's) CR has its own name (a model name is the router's across
    namespaces: the previous row's, still terminating, would own it)."""
    names: dict[Mode, str] = {None: NAME, False: f"{NAME}-cold", True: f"{NAME}-cached"}
    name = names.get(mode, f"{NAME}-{mode}")
    return f"{name}-cpu-{cpu.replace('.', '-').lower()}" if cpu else name


REGISTRY_BUILD = REPO_ROOT / "e2e" / "cluster" / "build-registry.sh"
IMAGES_PY = REPO_ROOT / "e2e" / "images" / "images.py"


@contextmanager
def loopback_registry(tmp: Path) -> Iterator[str]:
    """The simulator image, salted, in a registry on loopback; yields its reference."""
    built = subprocess.run([str(REGISTRY_BUILD)], capture_output=True, text=True, check=True)
    registry = Path(built.stdout.strip().splitlines()[-1]) / "registry"
    archive = tmp / "engine-sim.tar"
    subprocess.run(
        [sys.executable, str(IMAGES_PY), "archive", "--out", str(archive), "engine-sim"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = real_vllm.free_port()
    server = subprocess.Popen(
        [str(registry), "serve", "--address", f"127.0.0.1:{port}", "--dir", str(tmp / "blobs")]
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ref = f"127.0.0.1:{port}/llmop/engine-sim:bench-{secrets.token_hex(4)}"
        subprocess.run(
            [str(registry), "push", "--archive", str(archive), "--ref", ref, "--salt", ref[-8:]],
            check=True,
        )
        yield ref
    finally:
        server.terminate()
        server.wait(10)
        remove_from_node(ref)


def remove_from_node(ref: str) -> None:
    """The image off the real node, its content and unpacked layers too, as on a node that
    never ran it. The CRI keeps an image under its tag, its digest and its ID
    (`sha256:<config>`): every name that points at it goes. Removing the names is not enough:
    the CRI's pull lease keeps the blobs from garbage collection for a day, and a pull that
    finds them takes 20 ms; so the blobs and the unpacked layers (salted: nothing else uses
    them) are deleted by digest."""
    ctr = ["ctr", "-a", NODE_CONTAINERD, "-n", "k8s.io"]
    listed = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    repository = ref.rsplit(":", 1)[0]
    ours = {row[2] for row in rows if row[0].startswith((f"{repository}:", f"{repository}@"))}
    names = [row[0] for row in rows if row[2] in ours]
    blobs: list[str] = []
    chain: list[str] = []
    for digest in ours:
        manifest = json.loads(_ctr_out([*ctr, "content", "get", digest]))
        config_digest = manifest["config"]["digest"]
        config = json.loads(_ctr_out([*ctr, "content", "get", config_digest]))
        blobs += [layer["digest"] for layer in manifest["layers"]] + [config_digest, digest]
        chain = chain_ids(config["rootfs"]["diff_ids"])
    if names:
        subprocess.run([*ctr, "images", "rm", "--sync", *names], check=True, capture_output=True)
    if blobs:
        subprocess.run([*ctr, "content", "rm", *blobs], check=False, capture_output=True)
    # The unpacked layers too: a pull skips fetching a layer whose snapshot exists. The last
    # pod's container holds the top one until the kubelet's container GC (every minute).
    deadline = time.monotonic() + 180
    while chain:
        for key in reversed(chain):  # the top layer first: a parent cannot go before its child
            subprocess.run([*ctr, "snapshots", "rm", key], check=False, capture_output=True)
        left = set(_ctr_out([*ctr, "snapshots", "ls"]).split()) & set(chain)
        if not left:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ref}: layers still unpacked on the node after 180 s: {left}")
        time.sleep(2)


def _ctr_out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The unpacked layers' snapshot keys (OCI image spec: ChainID)."""
    out: list[str] = []
    for diff in diff_ids:
        parent = f"{out[-1]} " if out else None
        out.append(diff if parent is None else sha256_of(parent + diff))
    return out


def sha256_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


CLAIM = "tiny-model"
TINY_REPO = "llmop-test/tiny-random"
"""The tiny model's name on the Hub stand-in (`--compile-cache`: it comes through a model cache)."""


def host_address() -> str:
    """This machine's primary address: pods on the real node reach the host through it."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def simulator_cr(
    namespace: str,
    load_seconds: float,
    mode: Mode = None,
    image: str | None = None,
    cpu: str | None = None,
) -> dict[str, Any]:
    sample: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"] = {"name": name_of(mode, cpu), "namespace": namespace}
    sample["spec"]["engine"]["args"] = ["--sim-load-seconds", f"{load_seconds:g}"]
    if cpu is not None:
        # The container's CPU request and limit: the limit's CFS quota paces the Python start.
        sample["spec"]["resources"]["cpu"] = cpu
    if mode in ("pulled", "pre-pulled"):
        sample["spec"]["engine"]["image"] = image
        scheduling = sample["spec"].setdefault("scheduling", {})
        scheduling["prePullImage"] = mode == "pre-pulled"
    sample["spec"] = from_zero(sample["spec"])
    return sample


def vllm_cpu_cr(namespace: str, compile_cache: bool | None = None) -> dict[str, Any]:
    """The vLLM CPU CR; `compile_cache` None: the model from a hostPath volume (no model cache),
    else from the Hub stand-in into a model cache with the compile cache on or off."""
    spec = vllm_cpu_spec(CLAIM)
    if compile_cache is not None:
        spec["model"] = {
            "name": TINY_REPO,
            "cache": {"size": "1Gi", "compileCache": compile_cache},
        }
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name_of(compile_cache), "namespace": namespace},
        "spec": from_zero(spec),
    }


@contextmanager
def served(
    rc: RealCluster,
    engine: str,
    load_seconds: float,
    compile_cache: Mode = None,
    image: str | None = None,
    *,
    cpu: str | None = None,
) -> Iterator[str]:
    """The CR applied in a fresh namespace (with the tiny model's volume, or an empty model
    cache volume, for vLLM), deleted after; yields the namespace."""
    apps = create_namespace(rc.cluster, "wake")
    volume = None
    try:
        if engine == "simulator":
            cr = simulator_cr(apps, load_seconds, compile_cache, image, cpu)
        else:
            imported = import_into_node("engine-cpu")
            print(f"engine-cpu image: {imported:.0f} s", file=sys.stderr)
            if compile_cache is None:
                model = tiny_model.ensure(str(real_vllm.venv() / "bin" / "python"))
                volume = create_model_volume(rc.cluster, apps, CLAIM, model)
            else:
                claim = f"{name_of(compile_cache)}-model-cache"
                volume = create_cache_volume(rc.cluster, apps, claim, "1Gi")
            cr = vllm_cpu_cr(apps, compile_cache if isinstance(compile_cache, bool) else None)
        rc.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        yield apps
    finally:
        rc.kubectl("delete", "namespace", apps, "--timeout=180s", check=False)
        if volume is not None:
            delete_model_volume(rc.cluster, volume)


def _wakes(
    rc: RealCluster,
    router: str,
    apps: str,
    wakes: int,
    *,
    label: str,
    name: str,
    before_each: Any = None,
) -> list[tuple[str, dict[str, float], dict[str, float]]]:
    rows = []
    for index in range(wakes):
        # The first wait includes the first replica's start (minReplicas 0 starts at 1).
        try:
            row = one_wake(rc, apps, name, router, zero_timeout=600, before=before_each)
        except TimeoutError:
            # What held it: the CR's conditions and the namespace's pods, for the reader.
            for what in (["get", "llmd", name, "-o", "yaml"], ["get", "pods,jobs", "-o", "wide"]):
                shown = rc.kubectl(*what, "-n", apps, check=False)
                print(getattr(shown, "stdout", shown), file=sys.stderr)
            raise
        phases = engine_phases(rc, apps, name)
        rows.append((label, row, phases))
        print(
            f"{label} wake {index + 1}: {describe(row)}; engine: {phases}",
            file=sys.stderr,
            flush=True,
        )
    return rows


def _table(rows: list[tuple[str, dict[str, float]]], columns: tuple[str, ...]) -> None:
    """One row per wake, then each label's medians."""
    print("| setup | wake | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    seen: dict[str, int] = {}
    for label, row in rows:
        seen[label] = seen.get(label, 0) + 1
        print(
            f"| {label} | {seen[label]} | "
            + " | ".join(f"{row[c]:.1f}" if c in row else "-" for c in columns)
            + " |"
        )
    for label in dict.fromkeys(label for label, _ in rows):
        mine = [row for lab, row in rows if lab == label]
        medians = [
            f"{statistics.median(r[c] for r in mine if c in r):.1f}"
            if any(c in r for r in mine)
            else "-"
            for c in columns
        ]
        print(f"| {label} | median | " + " | ".join(medians) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=3)
    parser.add_argument("--load-seconds", type=float, default=5.0)
    parser.add_argument("--engine", choices=("simulator", "vllm-cpu"), default="simulator")
    parser.add_argument("--compile-cache", choices=("off", "on", "both"), default=None)
    parser.add_argument("--image-pull", choices=("both",), default=None)
    parser.add_argument(
        "--cpu",
        nargs="+",
        default=None,
        help="simulator: the engine container's CPU (request and limit), a row each "
        "(default: the sample's, 250m)",
    )
    args = parser.parse_args()
    if args.cpu and args.engine != "simulator":
        parser.error("--cpu is for the simulator (vLLM's CPU build takes the cores it needs)")
    if args.compile_cache and args.engine != "vllm-cpu":
        parser.error("--compile-cache is for --engine vllm-cpu")
    if args.image_pull and args.engine != "simulator":
        parser.error(
            "--image-pull is for the simulator (the 6 GB engine-cpu image, pushed and "
            "pulled back per wake, would be most of the run)"
        )
    by_option: dict[str | None, list[Mode]] = {
        None: [None],
        "off": [False],
        "on": [True],
        "both": [False, True],
    }
    modes = by_option[args.compile_cache]
    if args.image_pull:
        modes = [None, "pulled", "pre-pulled"]
    rows: list[tuple[str, dict[str, float], dict[str, float]]] = []
    # The gateway is not what this measures: the router lets the wake's request in without a key.
    values: dict[str, Any] = {
        **NODE_IMAGE_VALUES,
        "router": {**NODE_IMAGE_VALUES["router"], "gateway": {"enabled": False}},
    }
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmop-wake-"))
        if args.compile_cache:
            model = tiny_model.ensure(str(real_vllm.venv() / "bin" / "python"))
            hub = stack.enter_context(HubStandin([HubRepo(TINY_REPO, model)], host="0.0.0.0"))
            endpoint = f"http://{host_address()}:{hub.server.server_address[1]}"
            values["engine"] = {**values.get("engine", {}), "hubEndpoint": endpoint}
        rc = stack.enter_context(operator_on_real_node("bench", Path(tmp)))
        image = stack.enter_context(loopback_registry(Path(tmp))) if args.image_pull else None
        release = stack.enter_context(chart_on_real_node(rc, values))
        router = service_url(rc.cluster, release.namespace, f"{release.name}-router")
        for mode, cpu in [(mode, cpu) for mode in modes for cpu in args.cpu or [None]]:
            labels: dict[Mode, str] = {None: "on node" if image else "-", False: "off", True: "on"}
            label = labels.get(mode, str(mode))
            if cpu is not None:
                label = f"{cpu} CPU" if label == "-" else f"{label}, {cpu} CPU"
            # The pulled row's wakes find no image on the node, as a node that never ran it.
            before = (lambda: remove_from_node(str(image))) if mode == "pulled" else None
            with served(rc, args.engine, args.load_seconds, mode, image, cpu=cpu) as apps:
                rows += _wakes(
                    rc,
                    router,
                    apps,
                    args.wakes,
                    label=label,
                    name=name_of(mode, cpu),
                    before_each=before,
                )
    engine = (
        f"simulator engine (model load {args.load_seconds:g} s)"
        if args.engine == "simulator"
        else "vLLM's CPU build (engine-cpu image, tiny random model "
        + (
            "from the Hub stand-in through a model cache)"
            if args.compile_cache
            else "from a hostPath volume)"
        )
    )
    print(
        f"\nwake from zero: {engine}, the chart's operator and router pods on the real node; "
        "seconds after the request was sent\n"
    )
    _table([(label, row) for label, row, _ in rows], COLUMNS)
    print(
        "\nwhere the engine's start went (status.startup.replicas[].engine: the agent's reading "
        "of the engine's own log lines), seconds; engine Ready above = the container's start + "
        "these + the kubelet's next readiness probe\n"
    )
    _table([(label, phases) for label, _, phases in rows], ENGINE_PHASES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
