//! Application probes: "when was this workload last active", from the application itself. A
//! recent last activity vetoes idleness (the idle tracker caps the idle time by it).
//!
//! - [`HttpProbe`]: GET a URL and read a timestamp at a JSON pointer (Jupyter's `/api/status`
//!   has `last_activity` in RFC 3339).
//! - [`ExecProbe`]: run a command; exit code 0 means "active now".
//! - [`heartbeat_mtime_ms`]: the modification time of a file the application touches.
//!
//! The parsing is pure ([`last_activity_from_json`], [`parse_rfc3339_ms`]); the probes are thin.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

/// Why a probe gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The HTTP request failed (connection, timeout, non-2xx status).
    #[error("GET {url}: {message}")]
    Http { url: String, message: String },
    /// The body is not JSON, or the pointer does not lead to a timestamp.
    #[error("{pointer}: {message}")]
    Body { pointer: String, message: String },
    /// The command could not be started, or did not finish in time.
    #[error("{program}: {message}")]
    Exec { program: String, message: String },
    /// The heartbeat file cannot be read.
    #[error("{path}: {source}")]
    File { path: String, source: std::io::Error },
}

/// Milliseconds since the epoch of an RFC 3339 / ISO 8601 time such as
/// `2024-05-01T12:34:56.789012Z` or `2024-05-01T14:34:56+02:00`; `None` if it is not one.
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let t = text.trim().as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = t.get(range)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if t.len() < 19 || t[4] != b'-' || t[7] != b'-' || !matches!(t[10], b'T' | b't' | b' ') {
        return None;
    }
    if t[13] != b':' || t[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if t.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while t.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start {
            return None;
        }
        // First three fractional digits, padded: ".7" is 700 ms.
        for k in 0..3 {
            millis = millis * 10
                + t.get(start + k).filter(|_| start + k < end).map_or(0, |d| i64::from(d - b'0'));
        }
        i = end;
    }
    let offset_minutes = match t.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let h = i64::from(h1.checked_sub(b'0')?) * 10 + i64::from(h2.checked_sub(b'0')?);
            let m = i64::from(m1.checked_sub(b'0')?) * 10 + i64::from(m2.checked_sub(b'0')?);
            if h > 23 || m > 59 {
                return None;
            }
            if *sign == b'+' { h * 60 + m } else { -(h * 60 + m) }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds.checked_mul(1_000)?.checked_add(millis)?).ok()
}

pub use allot_core::days_from_civil;

/// The last-activity time (ms since the epoch) at `pointer` (RFC 6901, e.g. `/last_activity`)
/// in a JSON body: an RFC 3339 string, or a number of seconds since the epoch (numbers above
/// 10^11 are taken as milliseconds).
pub fn last_activity_from_json(body: &str, pointer: &str) -> Result<u64, ProbeError> {
    let error = |message: String| ProbeError::Body { pointer: pointer.to_string(), message };
    let value: Value =
        serde_json::from_str(body).map_err(|e| error(format!("the body is not JSON: {e}")))?;
    let found = value
        .pointer(pointer)
        .ok_or_else(|| error("no such field in the body (check the JSON pointer)".into()))?;
    match found {
        Value::String(s) => {
            parse_rfc3339_ms(s).ok_or_else(|| error(format!("{s:?} is not an RFC 3339 time")))
        }
        Value::Number(n) => {
            let v = n
                .as_f64()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| error(format!("{n} is not a non-negative number of seconds")))?;
            let ms = if v > 1e11 { v } else { v * 1_000.0 };
            if ms > u64::MAX as f64 {
                return Err(error(format!("{n} is too large")));
            }
            Ok(ms as u64)
        }
        other => Err(error(format!("expected a time string or number, found {other}"))),
    }
}

/// GET `url` and read the last activity at `pointer`.
#[derive(Clone, Debug)]
pub struct HttpProbe {
    pub url: String,
    pub pointer: String,
    pub timeout: Duration,
    /// Sent as `Authorization: token …` (Jupyter) when set.
    pub token: Option<String>,
}

impl HttpProbe {
    /// The last-activity time the application reports.
    pub fn probe(&self) -> Result<u64, ProbeError> {
        let http = |message: String| ProbeError::Http { url: self.url.clone(), message };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut request = agent.get(&self.url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", &format!("token {token}"));
        }
        let mut response = request.call().map_err(|e| http(e.to_string()))?;
        let status = response.status();
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_string()
            .map_err(|e| http(format!("reading the body: {e}")))?;
        if !status.is_success() {
            return Err(http(format!("status {status}")));
        }
        last_activity_from_json(&body, &self.pointer)
    }
}

/// Run a command; exit code 0 means the application is active now.
#[derive(Clone, Debug)]
pub struct ExecProbe {
    pub program: String,
    pub args: Vec<String>,
    pub timeout: Duration,
}

impl ExecProbe {
    /// `Ok(Some(now_ms))` when the command exits 0, `Ok(None)` on another exit code; an error
    /// when it cannot start or runs past the timeout (it is then killed).
    pub fn probe(&self, now_ms: u64) -> Result<Option<u64>, ProbeError> {
        let error = |message: String| ProbeError::Exec { program: self.program.clone(), message };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| error(format!("cannot start: {e}")))?;
        // A real clock: the timeout bounds a real child process.
        #[allow(clippy::disallowed_methods)]
        let started = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status.success().then_some(now_ms)),
                Ok(None) if started.elapsed() >= self.timeout => {
                    // Best effort: the child may have exited in between.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(error(format!("still running after {:?}; killed", self.timeout)));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(error(format!("waiting for it: {e}"))),
            }
        }
    }
}

/// The modification time of a heartbeat file, ms since the epoch.
pub fn heartbeat_mtime_ms(path: &Path) -> Result<u64, ProbeError> {
    let file_error = |source| ProbeError::File { path: path.display().to_string(), source };
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).map_err(file_error)?;
    let since = modified.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("2024-05-01T12:34:56.789012Z"), Some(1_714_566_896_789));
        assert_eq!(parse_rfc3339_ms("2024-05-01T14:34:56.7+02:00"), Some(1_714_566_896_700));
        assert_eq!(parse_rfc3339_ms("2000-02-29T00:00:00-00:30"), Some(951_784_200_000));
        for bad in [
            "",
            "2024-05-01",
            "2024-13-01T00:00:00Z",
            "2024-05-01T00:00:00",
            "x".repeat(30).as_str(),
            "2024-05-01T00:00:00.Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn json_pointer_to_a_time_or_number() {
        let jupyter = r#"{"started":"2024-05-01T10:00:00.000000Z","last_activity":"2024-05-01T12:00:00.500000Z","connections":0,"kernels":1}"#;
        assert_eq!(
            last_activity_from_json(jupyter, "/last_activity").expect("a time"),
            1_714_564_800_500
        );
        assert_eq!(
            last_activity_from_json(r#"{"a":{"t":1700000000}}"#, "/a/t").expect("seconds"),
            1_700_000_000_000
        );
        assert_eq!(
            last_activity_from_json(r#"{"t":1700000000123}"#, "/t").expect("ms"),
            1_700_000_000_123
        );
        assert!(matches!(last_activity_from_json(jupyter, "/nope"), Err(ProbeError::Body { .. })));
        assert!(last_activity_from_json("not json", "/t").is_err());
        assert!(last_activity_from_json(r#"{"t":true}"#, "/t").is_err());
        assert!(last_activity_from_json(r#"{"t":-1}"#, "/t").is_err());
    }

    #[test]
    fn exec_probe_exit_codes_and_timeout() {
        let probe = |program: &str, args: &[&str], timeout_ms| ExecProbe {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            timeout: Duration::from_millis(timeout_ms),
        };
        assert_eq!(probe("true", &[], 5_000).probe(42).expect("runs"), Some(42));
        assert_eq!(probe("false", &[], 5_000).probe(42).expect("runs"), None);
        assert!(probe("sleep", &["5"], 100).probe(42).is_err());
        assert!(probe("/nonexistent/probe", &[], 100).probe(42).is_err());
    }

    #[test]
    fn heartbeat_file() {
        let dir = std::env::temp_dir().join(format!("allot-telemetry-hb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("beat");
        std::fs::write(&file, b"x").expect("write");
        let mtime = heartbeat_mtime_ms(&file).expect("mtime");
        assert!(mtime > 1_600_000_000_000, "{mtime}");
        assert!(heartbeat_mtime_ms(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
