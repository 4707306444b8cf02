"""A tiny random-weight Llama model made at test time, for the real-vLLM tests (no model hub).

Run with the Python of the vLLM CPU venv (it has torch, transformers and tokenizers):
`<venv>/bin/python -P tests/support/tiny_model.py` prints the model directory (`-P`: this
directory's `operator.py` would shadow the standard library's). The directory is
cached outside the clone, keyed on this file and the library versions, and written to a temporary
sibling then renamed, so concurrent callers never see half a model. `ensure(python)` does the same
from the test process (which has no torch).

The model: LlamaForCausalLM, hidden 128, intermediate 384, 2 layers, 4 heads, vocab 2,048, max
positions 2,048, float32, seeded weights (~3.8 MB); a byte-level BPE tokenizer trained on the
Python standard library's own sources, and a chat template. It generates nonsense quickly, which
is all the tests need.

`--size bench` (`ensure(python, size="bench")`) makes a larger one of the same kind for the
router's real-engine benchmark (bench/router_vllm_bench.py): hidden 512, intermediate 1,536, 4
layers, 8 heads, max positions 4,096 (~16 M parameters, ~64 MB). Its prefill of a few thousand
tokens takes seconds on one CPU, so a prefix-cache hit saves a real, measurable prefill.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

VOCAB = 2048
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def cache_root() -> Path:
    base = os.environ.get("LLMOP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmop"
    )
    return Path(base) / "models"


def _training_files(limit: int = 200) -> list[str]:
    stdlib = Path(os.__file__).parent
    return sorted(str(p) for p in stdlib.glob("*.py"))[:limit]


SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
    },
    "bench": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096,
    },
}


def build(out: Path, size: str = "tiny") -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    shape = SIZES[size]
    fast.model_max_length = shape["max_position_embeddings"]
    config = LlamaConfig(
        vocab_size=VOCAB,
        **shape,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    fast.save_pretrained(out)


def _key(versions: str) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes() + versions.encode()).hexdigest()
    return digest[:12]


def main() -> int:
    size = sys.argv[sys.argv.index("--size") + 1] if "--size" in sys.argv else "tiny"
    if size not in SIZES:
        print(f"--size must be one of {sorted(SIZES)}, not {size!r}", file=sys.stderr)
        return 2
    import tokenizers
    import torch
    import transformers

    versions = (
        f"torch={torch.__version__} tf={transformers.__version__} tok={tokenizers.__version__}"
    )
    target = cache_root() / f"{size}-llama-{_key(versions)}"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
        build(tmp, size)
        try:
            tmp.rename(target)
        except OSError:  # a concurrent builder won; its model is identical
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    print(target)
    return 0


def ensure(python: str, timeout: float = 600.0, size: str = "tiny") -> Path:
    """Make (or reuse) the model with `python` (the vLLM venv's); returns its directory."""
    out = subprocess.run(
        # -P: tests/support/operator.py must not shadow `operator`
        [python, "-P", __file__, "--size", size],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tiny model generation failed: {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
