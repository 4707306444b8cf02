"""The operator ↔ downloader contract, end to end without a cluster: render a real download Job,
parse its container args with the downloader's own parser, and read the downloader's own
`/progress` JSON back into status.model.download. A renamed flag, exit code or progress key on
either side fails here (as test_engine_contract.py does for `llmop-engine run`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import model_cache
from llmop.settings import RenderSettings
from llmop_engine import contract, download
from llmop_engine import download_progress as dp

SHA = "a" * 40


def render_job() -> dict[str, Any]:
    llmd = LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "cache": {"size": "2Gi"}},
                "engine": {"backend": "simulator"},
                "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            },
        }
    )
    return model_cache.render_download_job(llmd, RenderSettings(), revision=SHA)


def test_the_rendered_job_parses_with_the_downloaders_own_parser() -> None:
    (container,) = render_job()["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == contract.DOWNLOAD
    parsed = download.parser({}).parse_args(args[1:])
    assert parsed.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert parsed.revision == SHA
    assert parsed.hf_home == names.MODEL_CACHE_PATH
    assert parsed.deadline_seconds == contract.DOWNLOAD_DEADLINE_SECONDS == 6 * 3600
    assert parsed.progress_port == contract.PROBE_PORT


def test_the_jobs_failure_policy_stops_on_the_downloaders_fatal_code() -> None:
    spec = render_job()["spec"]
    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"]["values"] == [download.EXIT_FATAL]
    # The Job outlives the downloader's own deadline, which then reports why it stopped.
    assert spec["activeDeadlineSeconds"] > contract.DOWNLOAD_DEADLINE_SECONDS
    codes = {
        download.EXIT_OK,
        download.EXIT_FATAL,
        download.EXIT_DEADLINE,
        download.EXIT_ATTEMPTS,
    }
    assert len(codes) == 4, "every outcome has its own exit code"


@pytest.mark.parametrize(
    ("phase", "shown"), [("downloading", "Downloading"), ("retrying", "Retrying")]
)
def test_progress_json_reads_back_into_the_status(phase: dp.DownloadPhase, shown: str) -> None:
    progress = dp.Progress(
        phase=phase,
        bytes_done=300 << 20,
        bytes_total=1 << 30,
        rate_bytes_per_second=25e6,
        eta_seconds=30.4,
        attempt=2,
        message="attempt 2",
    )
    status = model_cache.download_status("Downloading", "", progress.as_json(), None)
    assert status.phase == shown
    assert status.bytes_done == 300 << 20
    assert status.bytes_total == 1 << 30
    assert status.rate_bytes_per_second == 25_000_000
    assert status.eta_seconds == 30
    assert status.message == "attempt 2"
    assert set(progress.as_json()) == {
        v for k, v in vars(contract.ProgressKey).items() if not k.startswith("_")
    }


def test_huggingface_hub_reads_the_mounted_token_file(tmp_path: Path) -> None:
    """The renderer gives the token as a file named by HF_TOKEN_PATH, never as HF_TOKEN: the
    Hub library itself (what vLLM, the agent and the downloader call) must read it from there.
    A fresh interpreter, since the library reads the variable at import."""
    token_file = tmp_path / "token"
    token_file.write_text("hf_from_the_secret_volume\n")  # a Secret key may end with a newline
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env[contract.Env.HF_TOKEN_PATH] = str(token_file)
    read = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.get_token())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert read.stdout.strip() == "hf_from_the_secret_volume"
