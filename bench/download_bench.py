"""Model download benchmark (`make bench-download`): is the download step the bottleneck?

Against the local hub stand-in (tests/support/hub_standin.py, unthrottled) it times, for one
model of `--size-mib` split into `--shards` files:
- raw copy: `shutil.copyfile` of the same files on the same disk (the ceiling of any download
  into this disk);
- `llmop-engine download` as a real process (what the download Job runs): resolve, size,
  `snapshot_download` with the progress reporter, into an empty cache;
- the same again into the filled cache (a restart: nothing should move).
Prints a table; not a timed test. The stand-in is a single-process Python server, so the
download figure is a floor for what the client sustains, not a property of the real Hub.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.hub_standin import HubRepo, HubStandin, synthetic_model

MIB = 2**20


def raw_copy(source: Path, target: Path) -> float:
    target.mkdir(parents=True)
    began = time.perf_counter()
    for path in sorted(source.iterdir()):
        shutil.copyfile(path, target / path.name)
    os.sync()
    return time.perf_counter() - began


def download(endpoint: str, home: Path, workers: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"}
    began = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "llmop_engine",
            "download",
            "--model",
            "bench/model",
            "--hf-home",
            str(home),
            "--max-workers",
            str(workers),
        ],
        env=env,
        check=True,
        stderr=subprocess.DEVNULL,
    )
    os.sync()
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmop-dl-bench-") as tmp:
        root = Path(tmp)
        model = synthetic_model(root / "model", args.size_mib * MIB, shards=args.shards)
        total = sum(p.stat().st_size for p in model.iterdir())
        rows = [("raw copy (shutil.copyfile)", raw_copy(model, root / "copy"))]
        with HubStandin([HubRepo("bench/model", model)]) as hub:
            rows.append(
                ("llmop-engine download (cold cache)", download(hub.url, root / "hf", args.workers))
            )
            rows.append(
                ("llmop-engine download (warm cache)", download(hub.url, root / "hf", args.workers))
            )
        print(f"model: {total / MIB:.0f} MiB in {args.shards} files; {os.cpu_count()} CPUs")
        print(f"{'step':<40} {'seconds':>8} {'MiB/s':>8}")
        for name, seconds in rows:
            print(f"{name:<40} {seconds:8.2f} {total / MIB / seconds:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
