"""Catalog of GPU products: usable device memory as PyTorch/vLLM sees it.

vLLM sizes everything from ``torch.cuda.mem_get_info()[1]`` (total device memory), which is a
little below the marketing size and below ``nvidia-smi``'s total (the driver reserves some).
Keys are the values of the GPU-feature-discovery label ``nvidia.com/gpu.product``, so the
operator can look a node selector up directly; :func:`lookup_gpu` also accepts short names
(``H100``, ``A100-80GB``, ``L4``).

Where a figure comes from (GiB = 2**30 bytes):

* measured by vLLM: H100-80GB-HBM3 79.18 (llm-d/llm-d-benchmark
  ``config_explorer/empirical-vllm-memory-results.md``: "H100 GPUs (79.18 GiB total memory)",
  "Free memory on device: 78.57/79.18 GiB"); L40S 44.39 (vLLM log "total_gpu_memory (44.39GiB)"
  in a public NIM troubleshooting note, "L40S (44.4 GiB CUDA visible)").
* PyTorch OOM messages ("GPU 0 has a total capacity of X GiB") in public repositories: H100
  79.18/79.19, A100-80GB 79.15, H200 139.80, B200 178.36, L4 22.03, A10G 21.98, RTX 4090 23.64,
  A100-40GB 39.39, T4 14.75, V100-16GB 15.77, V100-32GB 31.74.
* estimated (nvidia-smi total minus the ≈0.45 GiB gap seen on L4/H100): A10 22.02, H100 NVL
  93.1, H100 PCIe 79.18, RTX 6000 Ada 47.4, A40 44.34, L40 44.39, H20 94.5, GH200 94.5.
  These are marked ``measured=False``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GPUProduct:
    """One GPU model as the planner needs it."""

    product: str
    """GPU-feature-discovery ``nvidia.com/gpu.product`` label value."""
    memory_gib: float
    """Total device memory reported by ``torch.cuda.mem_get_info`` (GiB)."""
    marketing_gb: int
    """Nameplate memory (GB), for messages."""
    aliases: tuple[str, ...] = ()
    measured: bool = True
    """False where ``memory_gib`` is estimated rather than seen in a real log."""
    vllm_a100: bool = False
    """vLLM gives A100s the small batch defaults even at 80 GB (arg_utils.get_batch_defaults)."""
    bandwidth_gbs: float = 0.0
    """Nameplate memory bandwidth (GB/s, NVIDIA's data sheets) for the decode throughput
    ceiling; 0: unknown."""
    gpus_per_node: int = 8
    """The most GPUs of this product one node usually has (8 on the usual datacenter and cloud
    servers: HGX/DGX boards, p5/a3/g5/g2 instances): a pod's GPUs cannot be spread over nodes,
    so the planner never suggests more GPUs per pod than this."""
    compute_capability: tuple[int, int] = (9, 0)
    """CUDA compute capability (NVIDIA's table): which of vLLM's kernels the GPU runs — FP8
    compute from 8.9, FP8 weight-only (Marlin) from 8.0, AWQ from 7.5."""


GPU_CATALOG: tuple[GPUProduct, ...] = (
    GPUProduct(
        "NVIDIA-H100-80GB-HBM3",
        79.18,
        80,
        ("H100", "H100-80GB", "H100-SXM", "H100-SXM5"),
        bandwidth_gbs=3350,
    ),
    GPUProduct(
        "NVIDIA-H100-PCIe",
        79.18,
        80,
        ("H100-PCIE", "H100-80GB-PCIE"),
        measured=False,
        bandwidth_gbs=2000,
    ),
    GPUProduct(
        "NVIDIA-H100-NVL", 93.1, 94, ("H100NVL", "H100-94GB"), measured=False, bandwidth_gbs=3900
    ),
    GPUProduct(
        "NVIDIA-H200",
        139.80,
        141,
        ("H200", "H200-141GB", "NVIDIA-H200-141GB-HBM3e"),
        bandwidth_gbs=4800,
    ),
    GPUProduct("NVIDIA-H20", 94.5, 96, ("H20",), measured=False, bandwidth_gbs=4000),
    GPUProduct("NVIDIA-GH200-480GB", 94.5, 96, ("GH200",), measured=False, bandwidth_gbs=4000),
    GPUProduct(
        "NVIDIA-B200",
        178.36,
        192,
        ("B200", "B200-192GB"),
        bandwidth_gbs=8000,
        compute_capability=(10, 0),
    ),
    GPUProduct(
        "NVIDIA-A100-SXM4-80GB",
        79.15,
        80,
        ("A100-80GB", "A100-SXM4-80GB", "A100-80G", "A800-80GB"),
        vllm_a100=True,
        bandwidth_gbs=2039,
        compute_capability=(8, 0),
    ),
    GPUProduct(
        "NVIDIA-A100-80GB-PCIe",
        79.15,
        80,
        ("A100-PCIE-80GB",),
        vllm_a100=True,
        bandwidth_gbs=1935,
        compute_capability=(8, 0),
    ),
    GPUProduct(
        "NVIDIA-A100-SXM4-40GB",
        39.39,
        40,
        ("A100", "A100-40GB", "A100-SXM4-40GB"),
        vllm_a100=True,
        bandwidth_gbs=1555,
        compute_capability=(8, 0),
    ),
    GPUProduct(
        "NVIDIA-A100-PCIE-40GB",
        39.39,
        40,
        ("A100-PCIE", "A100-PCIE-40GB"),
        vllm_a100=True,
        bandwidth_gbs=1555,
        compute_capability=(8, 0),
    ),
    GPUProduct("NVIDIA-L40S", 44.39, 48, ("L40S",), bandwidth_gbs=864, compute_capability=(8, 9)),
    GPUProduct(
        "NVIDIA-L40",
        44.39,
        48,
        ("L40",),
        measured=False,
        bandwidth_gbs=864,
        compute_capability=(8, 9),
    ),
    GPUProduct(
        "NVIDIA-A40",
        44.34,
        48,
        ("A40",),
        measured=False,
        bandwidth_gbs=696,
        compute_capability=(8, 6),
    ),
    GPUProduct(
        "NVIDIA-RTX-6000-Ada-Generation",
        47.4,
        48,
        ("RTX-6000-ADA",),
        measured=False,
        bandwidth_gbs=960,
        compute_capability=(8, 9),
    ),
    GPUProduct("NVIDIA-L4", 22.03, 24, ("L4",), bandwidth_gbs=300, compute_capability=(8, 9)),
    GPUProduct("NVIDIA-A10G", 21.98, 24, ("A10G",), bandwidth_gbs=600, compute_capability=(8, 6)),
    GPUProduct(
        "NVIDIA-A10",
        22.02,
        24,
        ("A10",),
        measured=False,
        bandwidth_gbs=600,
        compute_capability=(8, 6),
    ),
    GPUProduct(
        "NVIDIA-GeForce-RTX-4090",
        23.64,
        24,
        ("RTX-4090", "4090", "RTX4090"),
        bandwidth_gbs=1008,
        compute_capability=(8, 9),
    ),
    GPUProduct(
        "Tesla-T4", 14.75, 16, ("T4", "NVIDIA-T4"), bandwidth_gbs=320, compute_capability=(7, 5)
    ),
    GPUProduct(
        "Tesla-V100-SXM2-16GB",
        15.77,
        16,
        ("V100", "V100-16GB"),
        bandwidth_gbs=900,
        compute_capability=(7, 0),
    ),
    GPUProduct(
        "Tesla-V100-SXM2-32GB",
        31.74,
        32,
        ("V100-32GB",),
        bandwidth_gbs=900,
        compute_capability=(7, 0),
    ),
)


def _key(name: str) -> str:
    """Case-, separator- and vendor-prefix-insensitive key: ``nvidia h100_80gb`` → ``H10080GB``."""
    key = re.sub(r"[^A-Z0-9]", "", name.upper())
    for prefix in ("NVIDIAGEFORCE", "NVIDIA", "TESLA"):
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix) :]
            break
    return key


def _build_index() -> dict[str, GPUProduct]:
    index: dict[str, GPUProduct] = {}
    for gpu in GPU_CATALOG:
        for name in (gpu.product, *gpu.aliases):
            # First entry wins: the catalog lists the most common variant of a short name first
            # (``H100`` → SXM 80 GB, ``A100`` → 40 GB as in GFD's A100-SXM4-40GB).
            index.setdefault(_key(name), gpu)
    return index


_INDEX = _build_index()


DEFAULT_GPUS_PER_NODE = 8
"""GPUs per node assumed for a product the catalog does not know."""


def lookup_gpu(name: str) -> GPUProduct | None:
    """Find a GPU by GFD product label or short name; None when unknown."""
    return _INDEX.get(_key(name))


def gpus_per_node(name: str | None) -> int:
    """The most GPUs per pod the planner may suggest for a product (the catalog's, else 8)."""
    gpu = lookup_gpu(name) if name else None
    return gpu.gpus_per_node if gpu is not None else DEFAULT_GPUS_PER_NODE
