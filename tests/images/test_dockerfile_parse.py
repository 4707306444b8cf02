"""How the image builder reads Dockerfiles for its input key (pure; runs on any host)."""

from __future__ import annotations

import pytest
from builder import REPO, load_builder

images = load_builder()


def test_bases_resolve_args_and_skip_stages() -> None:
    text = (
        "ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm\n"
        "FROM ${PYTHON_IMAGE} AS build\nRUN true\n"
        "FROM build AS again\n"
        "FROM scratch\n"
        "FROM $PYTHON_IMAGE\n"
    )
    assert images.dockerfile_bases(text) == ["python:3.11.11-slim-bookworm"]


def test_sources_skip_stage_copies_and_join_continuations() -> None:
    text = (
        "FROM x\n"
        "# comment\n"
        "COPY pyproject.toml README.md ./\n"
        "COPY --chown=1:1 operator/src \\\n"
        "     operator/src\n"
        "COPY --from=build /opt/llmop /opt/llmop\n"
        'ADD ["engine-image/src/llmop_engine", "/opt/x"]\n'
    )
    assert images.dockerfile_sources(text) == [
        "pyproject.toml",
        "README.md",
        "operator/src",
        "engine-image/src/llmop_engine",
    ]


def test_add_from_url_is_refused() -> None:
    with pytest.raises(images.ImageError):
        images.dockerfile_sources("FROM x\nADD https://example.com/a.tgz /a\n")


@pytest.mark.parametrize(
    ("dockerfile", "base"),
    [
        ("operator/Dockerfile", "python:3.11.11-slim-bookworm"),
        ("engine-image/Dockerfile.sim", "python:3.11.11-slim-bookworm"),
        ("engine-image/Dockerfile", "vllm/vllm-openai:v0.33.0"),
    ],
)
def test_repository_dockerfiles(dockerfile: str, base: str) -> None:
    text = (REPO / dockerfile).read_text()
    assert images.dockerfile_bases(text) == [base]
    files = images.copied_files(text, REPO)
    assert files, f"{dockerfile} copies no files from the build context?"
    assert any(f.startswith("engine-image/src/llmop_engine/") for f in files)
    assert not any("__pycache__" in f for f in files)


def test_only_bases_without_a_stand_in_are_external() -> None:
    assert "python:3.11.11-slim-bookworm" in images.STANDINS
    assert "vllm/vllm-openai:v0.33.0" not in images.STANDINS
