//! What the daemon takes from the operating system everywhere: the wall clock and its own log
//! lines. A leaf: it imports nothing of the crate.

#[allow(clippy::disallowed_methods)] // the daemon's clock: the one place wall time enters
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether `tracing_log` writes: the whole-system simulation runs thousands of daemons in one
/// process and turns their lines off (it checks what they would say through its invariants).
static LOG_MUTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn mute_log() {
    LOG_MUTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The daemon's own log lines go to stderr (journald or the terminal).
pub(crate) fn tracing_log(line: &str) {
    if LOG_MUTED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
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
