"""`llmop` command line: run the operator, print the CRD, render children, plan capacity.

`render` and `plan` work offline on a manifest file, so a platform engineer sees exactly what
will be created, and whether the model fits, before anything reaches a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from llmop import crdgen, sizing
from llmop.api.v1alpha1 import API_VERSION, KIND, LLMDeployment
from llmop.desired import desired_state
from llmop.planner.capacity import CapacityPlan
from llmop.settings import DEFAULT_SIMULATOR_IMAGE, DEFAULT_VLLM_IMAGE, RenderSettings

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """A manifest file that cannot be read as LLMDeployments."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmop` console script."""
    parser = _parser()
    # `run` hands every flag it does not know to the operator's own parser.
    args, unknown = parser.parse_known_args(argv)
    if args.command == "run":
        args.operator_args = [*unknown, *args.operator_args]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        code: int = args.handler(args, sys.stdout)
    except InputError as error:
        print(f"llmop: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmop", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the operator (all namespaces, standalone)")
    run.add_argument("operator_args", nargs=argparse.REMAINDER, help="operator flags")
    run.set_defaults(handler=_run)

    crd = commands.add_parser("crd", help="print the LLMDeployment CRD")
    crd.set_defaults(handler=_crd)

    render = commands.add_parser("render", help="print the children of LLMDeployments")
    render.add_argument("-f", "--filename", required=True, type=Path, help="manifest ('-': stdin)")
    render.add_argument("--vllm-image", default=DEFAULT_VLLM_IMAGE)
    render.add_argument("--simulator-image", default=DEFAULT_SIMULATOR_IMAGE)
    render.add_argument("--service-monitor", action="store_true", help="also a ServiceMonitor")
    render.set_defaults(handler=_render)

    plan = commands.add_parser("plan", help="check that LLMDeployments fit their GPUs")
    plan.add_argument("-f", "--filename", required=True, type=Path, help="manifest ('-': stdin)")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.set_defaults(handler=_plan)
    return parser


NOT_IMPORTED = ("kubernetes",)
"""Installed beside the operator in a development environment (the tests use it), never used by
it: `llmop.kube` and `llmop.credentials` are its client. kopf imports it whenever it can, to offer
a login we replace: 16 MiB and 0.3 CPU-s of the process for nothing."""


def keep_out_unused_libraries() -> None:
    """Make `NOT_IMPORTED` unimportable in this process: call before kopf is imported."""
    for module in NOT_IMPORTED:
        # None in sys.modules: an import of it raises ImportError, as if it were not installed.
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]


def _run(args: argparse.Namespace, _out: TextIO) -> int:
    keep_out_unused_libraries()
    from llmop import main as operator_main  # kopf is heavy: import it only to run

    return operator_main.run(list(args.operator_args))


def _crd(_args: argparse.Namespace, out: TextIO) -> int:
    out.write(crdgen.render_crd_yaml())
    return EXIT_OK


def _render(args: argparse.Namespace, out: TextIO) -> int:
    settings = RenderSettings(
        vllm_image=args.vllm_image,
        simulator_image=args.simulator_image,
        service_monitor=args.service_monitor,
    )
    manifests: list[dict[str, Any]] = []
    for llmd in load_deployments(args.filename):
        # The operator's own desired state: what it would create, and nothing for a plan that
        # does not fit (said on stderr, so the YAML on stdout stays appliable).
        desired = desired_state(llmd, settings)
        if desired.children is None:
            print(
                f"llmop: {llmd.metadata.name}: {desired.sizing.message} "
                "The operator creates no children for it.",
                file=sys.stderr,
            )
            continue
        manifests += desired.children.wanted()
    yaml.safe_dump_all(manifests, out, sort_keys=False, width=100)
    return EXIT_OK


def _plan(args: argparse.Namespace, out: TextIO) -> int:
    results = [(d, sizing.plan_for(d.spec)) for d in load_deployments(args.filename)]
    if args.output == "json":
        json.dump([_plan_json(d, r) for d, r in results], out, indent=2)
        out.write("\n")
    else:
        for llmd, result in results:
            out.write(_plan_table(llmd, result))
    fits_all = all(result.fits is not False for _, result in results)
    return EXIT_OK if fits_all else EXIT_DOES_NOT_FIT


def _plan_json(llmd: LLMDeployment, result: sizing.SizingResult) -> dict[str, Any]:
    plan = result.plan
    body: dict[str, Any] = {
        "name": llmd.metadata.name,
        "model": llmd.spec.model.name,
        "fits": result.fits,
        "reason": result.reason,
        "message": result.message,
        "gpuMemoryGiB": result.gpu_memory_gib,
        "loadTimeoutSeconds": result.load_timeout_seconds,
    }
    if plan is not None:
        body |= {
            "tensorParallelSize": llmd.spec.tensor_parallel_size,
            "podsPerReplica": llmd.spec.pipeline_parallel_size,
            "weightsGiBTotal": round(plan.weights_gib_total, 2),
            "weightsGiBPerGPU": round(plan.weights_gib_per_gpu, 2),
            "overheadGiBPerGPU": round(plan.overhead_gib_per_gpu, 2),
            "kvCacheGiBPerGPU": round(plan.kv_cache_gib_per_gpu, 2),
            "shortfallGiBPerGPU": round(plan.shortfall_gib_per_gpu, 2),
            "kvBytesPerToken": plan.kv_bytes_per_token,
            "kvCacheTokens": plan.kv_cache_tokens,
            "maxModelLen": plan.max_model_len,
            "maxConcurrency": round(plan.max_concurrency, 2),
            "suggestions": list(plan.suggestions),
        }
    return body


def _kv_cache_cell(plan: CapacityPlan) -> str:
    cell = f"{plan.kv_cache_gib_per_gpu:.2f} GiB per GPU"
    if plan.shortfall_gib_per_gpu > 0:
        cell += f" (short by {plan.shortfall_gib_per_gpu:.2f} GiB per GPU)"
    return cell


def _plan_table(llmd: LLMDeployment, result: sizing.SizingResult) -> str:
    plan = result.plan
    lines = [f"{llmd.metadata.name} ({llmd.spec.model.name})"]
    if plan is None:
        lines.append(f"  not planned: {result.message}")
        return "\n".join(lines) + "\n\n"
    tp = llmd.spec.tensor_parallel_size
    pods = llmd.spec.pipeline_parallel_size
    rows = [
        ("GPU memory", f"{result.gpu_memory_gib:.2f} GiB x {tp} (tensor parallel)"),
        ("pods per replica", f"{pods} (pipeline parallel, {pods * tp} GPUs per replica)"),
        ("weights", f"{plan.weights_gib_total:.2f} GiB ({plan.weights_gib_per_gpu:.2f} per GPU)"),
        ("runtime overhead", f"{plan.overhead_gib_per_gpu:.2f} GiB per GPU"),
        ("KV cache", _kv_cache_cell(plan)),
        ("KV bytes/token", f"{plan.kv_bytes_per_token:,} per GPU"),
        ("KV tokens/replica", f"{plan.kv_cache_tokens:,}"),
        ("max model len", f"{plan.max_model_len:,}"),
        ("max concurrency", f"{plan.max_concurrency:.2f} sequences at max model len"),
        ("verdict", "fits" if plan.fits else f"DOES NOT FIT ({plan.reason})"),
    ]
    lines += [f"  {label:<18} {value}" for label, value in rows]
    if not plan.fits:
        lines.append(f"  {plan.message}")
        lines += [f"  try: {suggestion}" for suggestion in plan.suggestions]
    return "\n".join(lines) + "\n\n"


def load_deployments(path: Path) -> Iterator[LLMDeployment]:
    """Every LLMDeployment document in a YAML file (other kinds are skipped)."""
    text = sys.stdin.read() if str(path) == "-" else _read(path)
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from error
    found = False
    for document in documents:
        if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
            continue
        found = True
        document.setdefault("metadata", {}).setdefault("namespace", "default")
        try:
            yield LLMDeployment.model_validate(document)
        except ValidationError as error:
            raise InputError(f"{path}: invalid {KIND}: {error}") from error
    if not found:
        raise InputError(f"{path}: no {API_VERSION} {KIND} in the file")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from error


if __name__ == "__main__":
    sys.exit(main())
