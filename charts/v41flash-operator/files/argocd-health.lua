-- Argo CD health check for v41flash.io/V41FlashDeployment (kstatus conditions).
-- Install: argocd-cm key resource.customizations.health.v41flash.io_V41FlashDeployment (docs/helm-install.md).
-- Order matters: a status that describes an older generation says nothing about the current spec.
local hs = {}

local function find(conditions, type_)
  if conditions == nil then return nil end
  for _, c in ipairs(conditions) do
    if c.type == type_ then return c end
  end
  return nil
end

local generation = obj.metadata.generation or 0
local status = obj.status

if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the v41flash operator to observe the deployment"
  return hs
end

if status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation ..
    " (status describes generation " .. status.observedGeneration .. ")"
  return hs
end

local conditions = status.conditions
local stalled = find(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "Stalled") .. ": " .. (stalled.message or "")
  return hs
end

local reconciling = find(conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = reconciling.message or "Reconciling"
  return hs
end

local ready = find(conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  -- A Ready condition written for an older spec is not evidence about the current one.
  if ready.observedGeneration ~= nil and ready.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Ready describes generation " .. ready.observedGeneration
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = (ready.reason or "NotReady") .. ": " .. (ready.message or "")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
