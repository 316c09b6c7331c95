-- allot's submit-time gate for Slurm (the job_submit/lua plugin).
--
-- Every job submitted to a partition allot manages is held the moment slurmctld accepts it
-- (priority 0, tagged in its admin comment), so nothing starts before allot admits it: not
-- between two of allot's cluster watches, and not while allot is down. allot imports each
-- held job as pending work under its account and releases it onto the nodes it chose.
-- A job moved into a managed partition is held the same way. Users may still hold their own
-- jobs, but only the uids in RELEASERS (root, allot's user) may release a held job or move it
-- out of a managed partition.
--
-- Install: save this file as job_submit.lua in the directory of slurm.conf, add
-- `JobSubmitPlugins=lua` to slurm.conf and run `scontrol reconfigure`.
-- `allot slurm gate-script` prints this file with the settings below filled in.

-- allot-gate settings ------------------------------------------------------------------
-- Partitions whose jobs are held. Empty: every partition not listed in UNMANAGED.
local MANAGED = {}
-- Partitions allot leaves alone (its --slurm-unmanaged-partition).
local UNMANAGED = {}
-- Uids that may release a held job: root and the user allot runs as.
local RELEASERS = { [0] = true }
-- end of settings ----------------------------------------------------------------------

local TAG = "allot-gate: held at submission; allot releases it when admitted"
-- Slurm's "not set" for a 32-bit field: an update that leaves the priority alone.
local NO_VAL = 4294967294
-- ESLURM_ACCESS_DENIED in slurm_errno.h (Slurm 22.05 exports no symbol for it to Lua).
local ACCESS_DENIED = 2002

local function is_managed(name)
  if UNMANAGED[name] then
    return false
  end
  return next(MANAGED) == nil or MANAGED[name] == true
end

-- The partition a job that names none lands in; nil when it cannot be told.
local function default_partition(part_list)
  for name, part in pairs(part_list or {}) do
    local flag = part.flag_default
    if flag ~= nil and flag ~= 0 and flag ~= false then
      return part.name or name
    end
  end
  return nil
end

-- Whether a job asking for `spec` ("a,b"; nil: the default partition) is allot's to gate.
-- When in doubt (no default partition known), it is: holding is the safe side.
local function gated(spec, part_list)
  if spec == nil or spec == "" then
    local default = default_partition(part_list)
    return default == nil or is_managed(default)
  end
  for name in string.gmatch(spec, "[^,]+") do
    if is_managed(name) then
      return true
    end
  end
  return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if gated(job_desc.partition, part_list) then
    job_desc.priority = 0
    job_desc.admin_comment = TAG
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if RELEASERS[modify_uid] then
    return slurm.SUCCESS
  end
  if not gated(job_rec.partition, part_list) then
    -- Moved into a gated partition: held on entry, as if submitted there (without the tag:
    -- Slurm refuses a user's update that sets the admin comment).
    if job_desc.partition ~= nil and gated(job_desc.partition, part_list) then
      job_desc.priority = 0
    end
    return slurm.SUCCESS
  end
  local priority = job_desc.priority
  local releases = priority ~= nil and priority ~= 0 and priority ~= NO_VAL
  local leaves = job_desc.partition ~= nil and not gated(job_desc.partition, part_list)
  if releases or leaves then
    slurm.log_info("allot-gate: uid %s may not %s job %s: allot releases it when admitted",
      tostring(modify_uid), releases and "release" or "move out", tostring(job_rec.job_id))
    slurm.log_user("held by allot: it starts when allot admits it (allot why)")
    return ACCESS_DENIED
  end
  return slurm.SUCCESS
end
