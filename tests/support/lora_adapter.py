"""Random LoRA adapters for the tiny model of the real-vLLM tests, written without `peft`.

Run with the Python of the vLLM CPU venv (it has torch and safetensors; the project venv may
not): `<venv>/bin/python -P tests/support/lora_adapter.py HIDDEN KV_DIM LAYERS OUT RANK SEED
[OUT RANK SEED ...]` writes adapter folders. `write(python, model_dir, {out: (rank, seed)})` does
the same from the test process, reading the sizes from the model's own `config.json`.

The adapter is what vLLM 0.32 loads (measured: shared/reference/lora-and-scale-to-zero.md,
"Measured"): `adapter_config.json` (`peft_type LORA`, `r`, `lora_alpha 16`, `target_modules
[q_proj, v_proj]`, `bias none`) and `adapter_model.safetensors` with
`base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight`, float32. Both A and B
are N(0,1) * 0.5: PEFT initialises B to zero, and an adapter with B = 0 changes nothing, so a test
could not tell it from the base.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LORA_ALPHA = 16
TARGETS = ("q_proj", "v_proj")
SCALE = 0.5


def build(out: Path, *, hidden: int, kv_dim: int, layers: int, rank: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32) * SCALE

    out_dims = {"q_proj": hidden, "v_proj": kv_dim}
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(layers):
        for module in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = random(rank, hidden).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = random(out_dims[module], rank).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        # The runtime API ignores it (measured); a real adapter names its base here.
        "base_model_name_or_path": "tiny-llama",
        "r": rank,
        "lora_alpha": LORA_ALPHA,
        "target_modules": list(TARGETS),
        "bias": "none",
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))


def main(argv: list[str]) -> int:
    """`HIDDEN KV_DIM LAYERS` then `OUT RANK SEED` per adapter (one torch import for all)."""
    hidden, kv_dim, layers, *specs = argv
    for at in range(0, len(specs), 3):
        out, rank, seed = specs[at : at + 3]
        build(
            Path(out),
            hidden=int(hidden),
            kv_dim=int(kv_dim),
            layers=int(layers),
            rank=int(rank),
            seed=int(seed),
        )
        print(out)
    return 0


def write(python: str, model_dir: Path, adapters: dict[Path, tuple[int, int]]) -> None:
    """Adapters (folder → (rank, seed)) for the model in `model_dir`, written by `python` (the
    vLLM venv's) in one process: importing torch takes seconds."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_dim = hidden // heads * int(config.get("num_key_value_heads") or heads)
    args = [str(hidden), str(kv_dim), str(config["num_hidden_layers"])]
    for out, (rank, seed) in adapters.items():
        args += [str(out), str(rank), str(seed)]
    done = subprocess.run(
        # -P: tests/support/operator.py must not shadow the standard library's `operator`.
        [python, "-P", __file__, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"writing LoRA adapters failed: {done.stderr[-2000:]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
