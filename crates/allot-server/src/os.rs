//! What the daemon takes from the operating system everywhere: the wall clock and its own log
//! lines. A leaf: it imports nothing of the crate.

#[allow(clippy::disallowed_methods)] // the daemon's clock: the one place wall time enters
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The daemon's own log lines go to stderr (journald or the terminal).
pub(crate) fn tracing_log(line: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("allot: {line}");
    }
}

/// A process's group id (`/proc/PID/stat`, field 5), if it still runs here.
pub(crate) fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: read after the last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(2)?.parse().ok()
}
