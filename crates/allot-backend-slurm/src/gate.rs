//! The submit-time gate: `job_submit.lua` (Slurm's job_submit/lua plugin) holds every job of
//! a managed partition when slurmctld accepts it, so no job starts between two cluster
//! watches or while allot is down. [`gate_script`] fills in the script's settings;
//! [`describe`] says which gate a cluster has, from `scontrol show config`.

use std::collections::BTreeSet;

/// The script as shipped: every partition managed, only root may release.
pub const GATE_SCRIPT: &str = include_str!("../job_submit.lua");

/// The gate script for a cluster: `managed` (allot's `--slurm-partition`; `None`: every
/// partition not in `unmanaged`) is held, and `releasers` (root is always one) may release.
pub fn gate_script(
    managed: Option<&str>,
    unmanaged: &BTreeSet<String>,
    releasers: &BTreeSet<u32>,
) -> String {
    let set = |names: &mut dyn Iterator<Item = &str>| -> String {
        let entries: Vec<String> = names.map(|n| format!("[{}] = true", lua_string(n))).collect();
        if entries.is_empty() { "{}".to_string() } else { format!("{{ {} }}", entries.join(", ")) }
    };
    let mut uids: BTreeSet<u32> = releasers.clone();
    uids.insert(0);
    let uids: Vec<String> = uids.iter().map(|u| format!("[{u}] = true")).collect();
    GATE_SCRIPT
        .lines()
        .map(|line| match line {
            "local MANAGED = {}" => {
                format!("local MANAGED = {}", set(&mut managed.into_iter()))
            }
            "local UNMANAGED = {}" => {
                format!("local UNMANAGED = {}", set(&mut unmanaged.iter().map(String::as_str)))
            }
            "local RELEASERS = { [0] = true }" => {
                format!("local RELEASERS = {{ {} }}", uids.join(", "))
            }
            other => other.to_string(),
        })
        .map(|line| line + "\n")
        .collect()
}

/// A Lua string literal for a partition name (quotes and backslashes escaped).
fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            // Lua reads up to three decimal digits: pad, so that a digit after it is not
            // taken into the escape.
            c if c.is_control() => out.push_str(&format!("\\{:03}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Which gate the cluster has, for `allot nodes`: `scontrol show config`'s `JobSubmitPlugins`
/// (`None`: it could not be read).
pub fn describe(config: Option<&str>) -> String {
    const WATCH: &str = "the cluster watch holds each job submitted to Slurm directly when it \
                         sees it";
    let plugins = config.map(|text| {
        text.lines()
            .find_map(|line| {
                let (key, value) = line.split_once('=')?;
                (key.trim() == "JobSubmitPlugins").then(|| value.trim().to_string())
            })
            .unwrap_or_default()
    });
    match plugins {
        Some(p) if p.split(',').any(|p| p.trim() == "lua" || p.trim() == "job_submit/lua") => {
            format!(
                "submit-time: a job_submit/lua plugin is configured (allot's script assumed: \
                 allot slurm gate-script), holding jobs as slurmctld accepts them; {WATCH}, \
                 for jobs the script lets through"
            )
        }
        Some(_) => format!(
            "watch only: {WATCH}, so one can start before that; install the submit-time gate \
             (README, \"A Slurm cluster\")"
        ),
        None => format!("unknown (scontrol show config could not be read); {WATCH}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_filled_in_and_the_rest_is_the_script() {
        let unmanaged: BTreeSet<String> = ["debug".to_string(), "we\"ird".to_string()].into();
        let script = gate_script(Some("gpu"), &unmanaged, &[1001].into());
        assert!(script.contains("\nlocal MANAGED = { [\"gpu\"] = true }\n"), "{script}");
        assert!(
            script.contains("\nlocal UNMANAGED = { [\"debug\"] = true, [\"we\\\"ird\"] = true }\n"),
            "{script}"
        );
        assert!(script.contains("\nlocal RELEASERS = { [0] = true, [1001] = true }\n"));
        assert_eq!(script.lines().count(), GATE_SCRIPT.lines().count());
        let plain = gate_script(None, &BTreeSet::new(), &BTreeSet::new());
        assert_eq!(plain, GATE_SCRIPT);
    }

    #[test]
    fn the_gate_is_told_from_job_submit_plugins() {
        let with = "Configuration data as of 2026-12-04T04:00:00\nJobSubmitPlugins        = lua\n";
        assert!(describe(Some(with)).starts_with("submit-time: a job_submit/lua plugin"));
        let without = "JobSubmitPlugins        = (null)\n";
        assert!(describe(Some(without)).starts_with("watch only"));
        assert!(describe(Some("")).starts_with("watch only"));
        assert!(describe(None).starts_with("unknown"));
    }
}
