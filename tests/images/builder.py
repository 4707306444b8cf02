"""Shared helpers for the image tests: load e2e/images/images.py, decide whether we can build.

The builder is a script, not a package; it is loaded from its path under a private module name
(``images`` would clash with this test directory on the import path).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "e2e" / "images" / "images.py"


def load_builder() -> ModuleType:
    name = "llmop_images_builder"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def cannot_build_reason() -> str | None:
    """Why this host cannot run the daemonless builder, or None when it can."""
    if sys.platform != "linux":
        return f"image builds need Linux (chroot builds, debootstrap); this is {sys.platform}"
    if os.geteuid() != 0:
        return "image builds need root (buildah chroot isolation, debootstrap, umoci unpack)"
    if shutil.which("buildah") is None and shutil.which("apt-get") is None:
        return "buildah is not installed and there is no apt-get to install it"
    return None
