"""`llmop` command line: run the operator, print the CRD, render children, plan capacity,
mint a tenant's API key.

`render` and `plan` work offline on a manifest file, so a platform engineer sees exactly what
will be created, and whether the model fits, before anything reaches a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from llmop import crdgen, sizing
from llmop.api.v1alpha1 import API_VERSION, KIND, LLMDeployment
from llmop.desired import desired_state
from llmop.planner import ModelArchitecture, lookup_model
from llmop.planner.capacity import CapacityPlan, cost_per_million_tokens
from llmop.planner.model_config import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_INDEX_PREFIX,
    ModelConfigError,
    ModelFiles,
    facts_from_files,
)
from llmop.planner.vllm_profile import ENGINE_VLLM_VERSION
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


def _facts_arguments(command: argparse.ArgumentParser, *, default_source: str) -> None:
    """Where `plan` and `render` take the facts of a model outside the catalog from."""
    command.add_argument(
        "--model-files",
        type=Path,
        metavar="DIR",
        help="plan from DIR/config.json (and DIR/model.safetensors.index.json): no network",
    )
    command.add_argument(
        "--source",
        choices=("auto", "hub", "catalog"),
        default=default_source,
        help="without --model-files: auto = the catalog for models it knows, else the Hub "
        "(HF_TOKEN, HF_ENDPOINT), as the operator plans; hub = the Hub for every model, the "
        f"catalog if unreachable; catalog = no network (default {default_source})",
    )


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
    _facts_arguments(render, default_source="catalog")
    render.set_defaults(handler=_render)

    plan = commands.add_parser("plan", help="check that LLMDeployments fit their GPUs")
    plan.add_argument("-f", "--filename", required=True, type=Path, help="manifest ('-': stdin)")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _facts_arguments(plan, default_source="auto")
    plan.add_argument(
        "--vllm-version",
        default=ENGINE_VLLM_VERSION,
        help=f"the engine's vLLM release (default {ENGINE_VLLM_VERSION}, the engine image's)",
    )
    plan.add_argument(
        "--gpu-hour-price",
        type=float,
        default=None,
        metavar="PRICE",
        help="price of one GPU-hour: prints the cost per million output tokens at the ceiling",
    )
    plan.set_defaults(handler=_plan)
    key = commands.add_parser(
        "key", help="mint an API key for an LLMTenant (prints the key once, and its SHA-256)"
    )
    key_commands = key.add_subparsers(dest="key_command", required=True)
    new = key_commands.add_parser("new", help="a new key: the key, then the LLMTenant entry")
    new.add_argument("tenant", help="the LLMTenant's name")
    new.add_argument(
        "--name", default=None, help="the key's name in the tenant (default: key-<date>)"
    )
    new.add_argument(
        "--not-after",
        default=None,
        metavar="RFC3339",
        help="when the key stops working, e.g. 2027-03-01T00:00:00Z (rotation by overlap)",
    )
    new.set_defaults(handler=_new_key)
    return parser


def _new_key(args: argparse.Namespace, out: TextIO) -> int:
    """Print a new key once (it is never stored) and the `spec.apiKeys` entry that admits it."""
    import datetime
    import secrets

    from llmop_router.contract import API_KEY_PREFIX, api_key_hash

    key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    name = args.name or f"key-{datetime.datetime.now(datetime.UTC):%Y%m%d-%H%M%S}"
    entry: dict[str, Any] = {"name": name, "sha256": api_key_hash(key), "prefix": key[:10]}
    if args.not_after:
        entry["notAfter"] = args.not_after
    out.write(f"# the key (shown once; the cluster keeps only its SHA-256):\n{key}\n")
    out.write(f"# add this entry to LLMTenant {args.tenant}'s spec.apiKeys:\n")
    out.write(yaml.safe_dump([entry], sort_keys=False))
    return EXIT_OK


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
        # does not fit (said on stderr, so the YAML on stdout stays appliable). A model outside
        # the catalog is planned from its files, as the operator does, when they are given.
        architecture, _ = _model_facts(args, llmd)
        facts = None if architecture is None else sizing.FactsVerdict(architecture=architecture)
        desired = desired_state(llmd, settings, facts=facts)
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
    results = []
    for llmd in load_deployments(args.filename):
        facts, said = _model_facts(args, llmd)
        result = sizing.plan_for(llmd.spec, facts=facts, vllm_version=args.vllm_version)
        results.append((llmd, result, said))
    price = args.gpu_hour_price
    if args.output == "json":
        json.dump([_plan_json(d, r, said, price) for d, r, said in results], out, indent=2)
        out.write("\n")
    else:
        for llmd, result, said in results:
            out.write(_plan_table(llmd, result, said, price))
    fits_all = all(result.fits is not False for _, result, _ in results)
    return EXIT_OK if fits_all else EXIT_DOES_NOT_FIT


def _read_model_files(directory: Path) -> ModelFiles:
    """config.json and the start of the safetensors index from a directory (no network)."""
    config_path, index_path = directory / CONFIG_FILE, directory / INDEX_FILE
    if not config_path.is_file():
        raise InputError(f"{config_path}: no such file (--model-files needs {CONFIG_FILE})")
    index = None
    if index_path.is_file():
        with index_path.open("rb") as handle:
            index = handle.read(MAX_INDEX_PREFIX).decode("utf-8", errors="replace")
    return ModelFiles(config_text=_read(config_path), index_text=index)


def _model_facts(
    args: argparse.Namespace, llmd: LLMDeployment
) -> tuple[ModelArchitecture | None, str]:
    """The model facts to plan with and where they came from, in words."""
    model = llmd.spec.model
    if model.architecture is not None:
        return None, "spec.model.architecture"
    try:
        if args.model_files is not None:
            files = _read_model_files(args.model_files)
            facts = facts_from_files(files, name=model.name, source="files")
            return facts, f"files in {args.model_files}"
        in_catalog = lookup_model(model.name) is not None
        if "://" in model.name or (in_catalog and args.source != "hub"):
            return None, "catalog" if in_catalog else "none"
        return _hub_facts(model.name, model.revision, in_catalog=in_catalog)
    except ModelConfigError as error:
        raise InputError(f"{model.name}: {error}") from error


def _hub_facts(
    name: str, revision: str | None, *, in_catalog: bool
) -> tuple[ModelArchitecture | None, str]:
    from llmop import hub  # huggingface_hub is slow to import: only when the Hub is asked
    from llmop.preflight import HubFailure

    answer = hub.model_files(
        name,
        revision,
        token=os.environ.get("HF_TOKEN") or None,
        endpoint=os.environ.get("HF_ENDPOINT") or None,
        timeout=10.0,
    )
    if isinstance(answer, HubFailure):
        fallback = "catalog" if in_catalog else "none"
        return None, f"{fallback} (Hub: {answer.kind}: {answer.detail})"
    facts = facts_from_files(answer, name=name, source="hub")
    return facts, f"hub ({name}@{(answer.revision or '')[:12]})"


def _plan_json(
    llmd: LLMDeployment, result: sizing.SizingResult, said: str, price: float | None
) -> dict[str, Any]:
    plan = result.plan
    body: dict[str, Any] = {
        "name": llmd.metadata.name,
        "model": llmd.spec.model.name,
        "modelFacts": said,
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
            "maxNumSeqs": result.max_num_seqs,
            "maxNumBatchedTokens": plan.max_num_batched_tokens,
            "kvCacheGroups": plan.kv_groups,
            "vllmProfile": plan.vllm_profile,
            "decodeCeilingTokensPerSecond": _round(plan.decode_ceiling_tokens_per_s),
            "costPerMillionOutputTokensFloor": _round(_cost(llmd, plan, price), 4),
            "suggestions": list(plan.suggestions),
        }
    return body


def _round(value: float | None, digits: int = 0) -> float | None:
    return None if value is None else round(value, digits)


def _cost(llmd: LLMDeployment, plan: CapacityPlan, price: float | None) -> float | None:
    if price is None or plan.decode_ceiling_tokens_per_s is None:
        return None
    gpus = llmd.spec.tensor_parallel_size * llmd.spec.pipeline_parallel_size
    return cost_per_million_tokens(plan.decode_ceiling_tokens_per_s, price, gpus)


def _kv_cache_cell(plan: CapacityPlan) -> str:
    cell = f"{plan.kv_cache_gib_per_gpu:.2f} GiB per GPU"
    if plan.shortfall_gib_per_gpu > 0:
        cell += f" (short by {plan.shortfall_gib_per_gpu:.2f} GiB per GPU)"
    return cell


def _plan_table(
    llmd: LLMDeployment, result: sizing.SizingResult, said: str, price: float | None
) -> str:
    plan = result.plan
    lines = [f"{llmd.metadata.name} ({llmd.spec.model.name})", f"  {'model facts':<18} {said}"]
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
        (
            "batch budget",
            f"maxNumSeqs {result.max_num_seqs}, maxNumBatchedTokens "
            f"{plan.max_num_batched_tokens:,} (vLLM {plan.vllm_profile}, "
            f"{plan.kv_groups} KV group{'s' if plan.kv_groups > 1 else ''})",
        ),
    ]
    ceiling = plan.decode_ceiling_tokens_per_s
    if ceiling is not None:
        rows.append(
            (
                "decode ceiling",
                f"{ceiling:,.0f} output tokens/s per replica at batch {plan.decode_batch} "
                "(memory-bandwidth CEILING, not a forecast)",
            )
        )
        cost = _cost(llmd, plan, price)
        if cost is not None:
            rows.append(
                ("cost floor", f"{cost:.4f} per 1M output tokens at {price:g} per GPU-hour")
            )
    rows.append(("verdict", "fits" if plan.fits else f"DOES NOT FIT ({plan.reason})"))
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
