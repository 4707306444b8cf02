"""Run docs/gitops/argocd-health.lua the way Argo CD runs resource health scripts.

Argo CD evaluates health checks with gopher-lua, a Lua 5.1 implementation, in a VM that opens
only the base, table and a "safe" os library (no string or math unless `useOpenLibs`), with the
live object as the global `obj`; the script returns `{status = ..., message = ...}`. `lupa`
bundles the reference Lua 5.1, and the script runs here in an environment that holds only base
functions, `table` and `obj`, so a script that needs anything Argo CD would not give it fails
here too.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from lupa.lua51 import LuaRuntime  # type: ignore[import-untyped]  # lupa ships no stubs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
HEALTH_LUA = REPO_ROOT / "docs" / "gitops" / "argocd-health.lua"
FIXTURES = REPO_ROOT / "tests" / "fixtures"
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

_SANDBOX = """
local script, obj = ...
local chunk, err = loadstring(script, "=argocd-health.lua")
if chunk == nil then error(err) end
setfenv(chunk, {
  ipairs = ipairs, pairs = pairs, next = next, type = type, tostring = tostring,
  tonumber = tonumber, error = error, pcall = pcall, select = select, unpack = unpack,
  table = table, obj = obj,
})
local hs = chunk()
return hs.status, hs.message
"""


def health(obj: Mapping[str, Any], script: str | None = None) -> tuple[str, str]:
    """(status, message) Argo CD would show for `obj` (an LLMDeployment as JSON)."""
    lua = LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    table = lua.table_from(dict(obj), recursive=True)
    run = lua.eval("function(...) " + _SANDBOX + " end")
    status, message = run(script if script is not None else HEALTH_LUA.read_text(), table)
    if status not in ARGO_STATUSES:
        raise ValueError(f"health script returned an unknown status {status!r}")
    return str(status), str(message)
