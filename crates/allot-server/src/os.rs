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

/// The daemon's own log lines go to stderr. Under journald, which stamps every line itself
/// (and sets `JOURNAL_STREAM` for the services it runs), as they are; elsewhere (a terminal,
/// a file) after the UTC time to the millisecond, so that a line says when it happened.
pub(crate) fn tracing_log(line: &str) {
    if LOG_MUTED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    static UNDER_JOURNALD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let stamp = if *UNDER_JOURNALD.get_or_init(|| std::env::var_os("JOURNAL_STREAM").is_some()) {
        String::new()
    } else {
        format!("{} ", rfc3339_ms(wall_ms()))
    };
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{stamp}allot: {line}");
    }
}

/// `YYYY-MM-DDThh:mm:ss.mmmZ` (RFC 3339, UTC) from ms since the Unix epoch.
fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (year, month, day) = allot_core::civil_from_days((secs / 86_400) as i64);
    let (h, m, s) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z", ms % 1000)
}

/// A process's group id (`/proc/PID/stat`, field 5), if it still runs here.
pub(crate) fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: read after the last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::rfc3339_ms;

    #[test]
    fn log_stamps_are_rfc3339_utc_to_the_millisecond() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_046_291_054), "2026-11-30T13:44:51.054Z");
        assert_eq!(rfc3339_ms(951_782_400_999), "2000-02-29T00:00:00.999Z");
    }
}
