-- Argo CD health check for serving.llmop.dev/LLMDeployment.
--
-- Argo CD has no generic health for custom resources; this reads llmop's kstatus-style status
-- the same way Flux does:
--   * the operator has not observed the current spec (status.observedGeneration < generation)
--     -> Progressing (also hides a Stalled verdict about an older spec that was just fixed)
--   * Stalled=True                      -> Degraded   (needs a human: the message says why)
--   * Ready=True                        -> Healthy
--   * anything else                     -> Progressing (Ready=False/Unknown, rolling out, ...)
-- Degraded=True (a replica restarting, unpullable, unschedulable, or Ready with a failing deep
-- probe) never changes the verdict, as kstatus (Flux) ignores it too: it is appended to the
-- message, so the app still syncs and a person still sees it. Needs-a-human is Stalled's job.
-- Only Lua base functions are used: Argo CD does not open the string library for health scripts.
local hs = {status = "Progressing", message = "Waiting for the llmop operator to report status"}
if obj.status == nil then
  return hs
end

local function condition(conditionType)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or fallback
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if observed == nil or (generation ~= nil and observed < generation) then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

local function withDegraded(text)
  local degraded = condition("Degraded")
  if degraded ~= nil and degraded.status == "True" then
    return text .. " (Degraded: " .. describe(degraded, "Degraded") .. ")"
  end
  return text
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = withDegraded(describe(ready, "Ready"))
  return hs
end

hs.message = withDegraded(describe(ready, "Not ready yet"))
return hs
