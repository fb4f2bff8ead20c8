-- Argo CD health check for streamreplicator.io/StreamReplication (docs/gitops.md).
-- The operator's healthy state has Progressing=False and Degraded=False, so a False condition is
-- never read as a failure here: each condition is read by its type, its status and its reason.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end

local c = {}
for _, condition in ipairs(obj.status.conditions) do
  c[condition.type] = condition
end

local function is(kind, value)
  return c[kind] ~= nil and c[kind].status == value
end

local function say(condition)
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end

-- Paused by annotation: nothing is reconciled, whatever the last state was.
if is("Paused", "True") then
  hs.status = "Suspended"
  hs.message = say(c["Paused"])
  return hs
end

-- A spec the operator has not read yet: its conditions describe an older one.
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "the operator has not yet observed generation " .. tostring(generation)
  return hs
end

-- Problems: permanent ones (Stalled) and those the operator retries (Degraded).
if is("Stalled", "True") then
  hs.status = "Degraded"
  hs.message = say(c["Stalled"])
  return hs
end
if is("Degraded", "True") then
  hs.status = "Degraded"
  hs.message = say(c["Degraded"])
  return hs
end
-- A worker refuses to copy what would come back to the source (a copy loop).
if is("CopyLoop", "True") then
  hs.status = "Degraded"
  hs.message = say(c["CopyLoop"])
  return hs
end
-- Mounted certificates that expired or cannot be read: the workers cannot connect with them.
if is("CertificatesExpiring", "True") then
  local reason = c["CertificatesExpiring"].reason
  if reason == "CertificateExpired" or reason == "CertificateUnreadable" then
    hs.status = "Degraded"
    hs.message = say(c["CertificatesExpiring"])
    return hs
  end
end

-- Work in progress: a rollout, the Deployment being created, an engine handover.
if is("Reconciling", "True") or is("Progressing", "True") then
  hs.status = "Progressing"
  hs.message = say(c["Reconciling"] or c["Progressing"])
  return hs
end

if is("Ready", "True") then
  hs.status = "Healthy"
  hs.message = say(c["Ready"])
  if is("CertificatesExpiring", "True") then
    hs.message = hs.message .. "; " .. say(c["CertificatesExpiring"])
  end
  return hs
end

-- Ready False without a problem: pods not ready yet, NATS still connecting or catching up.
hs.status = "Progressing"
if c["Ready"] ~= nil then
  hs.message = say(c["Ready"])
end
return hs
