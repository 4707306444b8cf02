"""Fill vLLM's model-info cache (`$VLLM_CACHE_ROOT/modelinfos`) at image build time.

At every start vLLM inspects the model's class (does it take multimodal input, LoRA, pipeline
parallelism...). It keeps the answer in `$VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json`,
keyed by a hash of the model's module file, and on a miss asks a new Python process, which
imports torch and vLLM again (`vllm/model_executor/models/registry.py`, `_run_in_subprocess`):
8.4 s of a start on 2 cores, measured. A container starts with an empty cache, so every start
without a compile cache paid it. The answers depend only on the installed vLLM, so the image
computes them once, for every architecture vLLM registers, in this one process (no GPU here, which
is what vLLM's subprocess guards against), and writes them where vLLM reads them, with vLLM's
own hash. An architecture whose module does not import here is left out (vLLM then asks at start,
as before). Uses vLLM 0.32's registry internals: a vLLM without them fails this script, not the
image (the Dockerfile says so).

    VLLM_CACHE_ROOT=/home/llmop/.cache/vllm python3 seed_modelinfos.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    started = time.monotonic()
    from vllm.model_executor.models import registry

    root = Path(registry.__file__).parent
    written, cached, failed = 0, 0, []
    seen: set[tuple[str, str]] = set()
    for arch, model in sorted(registry.ModelRegistry.models.items()):
        if not isinstance(model, registry._LazyRegisteredModel):
            continue
        if (model.module_name, model.class_name) in seen:
            continue
        seen.add((model.module_name, model.class_name))
        if not model.module_name.startswith("vllm.model_executor.models."):
            continue
        path = root / f"{model.module_name.rsplit('.', 1)[-1]}.py"
        if not path.exists():
            continue
        module_hash = model._get_modelinfo_module_hash(path)
        if model._load_modelinfo_from_cache(module_hash) is not None:
            cached += 1
            continue
        try:
            info = registry._ModelInfo.from_model_cls(model.load_model_cls())
        except Exception as exc:  # an optional dependency this image lacks: vLLM asks at start
            failed.append(f"{arch} ({type(exc).__name__})")
            continue
        model._save_modelinfo_to_cache(info, module_hash)
        written += 1
    where = os.environ.get("VLLM_CACHE_ROOT", "vLLM's default cache root")
    print(
        f"seed_modelinfos: {written} written, {cached} already there, {len(failed)} left out, "
        f"in {where}, {time.monotonic() - started:.0f} s"
        + (f"; left out: {', '.join(failed)}" if failed else "")
    )
    return 0 if written + cached else 1


if __name__ == "__main__":
    sys.exit(main())
