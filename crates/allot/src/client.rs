//! The daemon's HTTP client: one blocking request per call, the server's `ApiError` and
//! transport failures mapped to the CLI's exit codes (see `EXIT_CODES` in main.rs).

use std::path::Path;
use std::time::Duration;

use allot_api::{API_PREFIX, ApiError};
use anyhow::{Context, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use ureq::tls::{PemItem, RootCerts, TlsConfig};

use crate::{
    EXIT_INTERNAL, EXIT_INVALID, EXIT_NOT_ALLOWED, EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_USAGE,
    Failure, RemoteArgs,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response read (logs are asked for by tail size; lists are far smaller).
const RESPONSE_BYTES_MAX: u64 = 64 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct Client {
    agent: ureq::Agent,
    /// The base address without a trailing slash, as the user gave it (for messages).
    base: String,
    token: Option<String>,
}

/// A JSON response: the typed value for the text renderers and the value as received, for
/// `--output json`.
#[derive(Debug)]
pub(crate) struct Json<T> {
    pub(crate) value: T,
    pub(crate) raw: serde_json::Value,
    /// The body as received (keys in the server's order).
    pub(crate) text: String,
    /// Set when `raw` was changed after receipt (a client-side filter): print `raw` then.
    pub(crate) edited: bool,
}

impl<T> Json<T> {
    /// The response pretty-printed with a final newline: the received text re-indented (the
    /// server's key order kept), or the edited value.
    pub(crate) fn pretty(&self) -> String {
        let mut text = if self.edited {
            serde_json::to_string_pretty(&self.raw).unwrap_or_default()
        } else {
            reindent(&self.text)
        };
        text.push('\n');
        text
    }
}

/// Pretty-prints valid JSON text with two-space indents, keeping its key order (a
/// `serde_json::Value` would sort the keys).
fn reindent(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    let mut chars = json.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('}' | ']')) {
                    out.extend(chars.next());
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

enum Body<'a> {
    None,
    Json(&'a [u8]),
    Text(&'a str),
}

impl Client {
    pub(crate) fn new(remote: &RemoteArgs) -> Result<Client> {
        let base = remote.url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Failure::new(
                EXIT_USAGE,
                format!(
                    "error: --url / ALLOT_URL {:?} is not an http:// or https:// address — fix: e.g. http://127.0.0.1:7380\n",
                    remote.url
                ),
            )
            .into());
        }
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            .user_agent(concat!("allot/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &remote.ca_cert {
            config = config.tls_config(
                TlsConfig::builder().root_certs(RootCerts::new_with_certs(&load_ca(ca)?)).build(),
            );
        }
        let token = remote.token.as_ref().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        Ok(Client { agent: config.build().new_agent(), base, token })
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Json<T>> {
        decode(path, &self.request("GET", path, &Body::None)?)
    }

    pub(crate) fn get_text(&self, path: &str) -> Result<String> {
        self.request("GET", path, &Body::None)
    }

    /// POST with a JSON body (`None`: empty body).
    pub(crate) fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Json<T>> {
        let bytes = match body {
            Some(body) => Some(serde_json::to_vec(body).context("encoding the request")?),
            None => None,
        };
        let body = bytes.as_deref().map_or(Body::None, Body::Json);
        decode(path, &self.request("POST", path, &body)?)
    }

    /// POST with a plain-text body (the policy to validate).
    pub(crate) fn post_text<T: DeserializeOwned>(&self, path: &str, text: &str) -> Result<Json<T>> {
        decode(path, &self.request("POST", path, &Body::Text(text))?)
    }

    /// POST with a JSON body whose answer has no body (202 Accepted).
    pub(crate) fn post_accepted(&self, path: &str, body: &impl Serialize) -> Result<()> {
        let bytes = serde_json::to_vec(body).context("encoding the request")?;
        self.request("POST", path, &Body::Json(&bytes)).map(|_| ())
    }

    /// DELETE (the policy in shadow).
    pub(crate) fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<Json<T>> {
        decode(path, &self.request("DELETE", path, &Body::None)?)
    }

    /// PUT with a plain-text body (the policy to apply).
    pub(crate) fn put_text<T: DeserializeOwned>(&self, path: &str, text: &str) -> Result<Json<T>> {
        decode(path, &self.request("PUT", path, &Body::Text(text))?)
    }

    /// `path` is under the API prefix (`/workloads?…`); returns the body of a 2xx response.
    fn request(&self, method: &str, path: &str, body: &Body<'_>) -> Result<String> {
        let url = format!("{}{API_PREFIX}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let sent = if method == "GET" || method == "DELETE" {
            let mut request =
                if method == "GET" { self.agent.get(&url) } else { self.agent.delete(&url) };
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.call()
        } else {
            let mut request =
                if method == "PUT" { self.agent.put(&url) } else { self.agent.post(&url) };
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            match body {
                Body::None => request.send_empty(),
                Body::Json(bytes) => {
                    request.header("Content-Type", "application/json").send(*bytes)
                }
                Body::Text(text) => {
                    request.header("Content-Type", "text/plain; charset=utf-8").send(*text)
                }
            }
        };
        let mut response = sent.map_err(|e| self.transport_failure(&url, e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|e| self.transport_failure(&url, e))?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(status_failure(method, path, status, &text).into())
    }

    fn transport_failure(&self, url: &str, error: ureq::Error) -> anyhow::Error {
        let unreachable = matches!(
            error,
            ureq::Error::ConnectionFailed
                | ureq::Error::HostNotFound
                | ureq::Error::Timeout(_)
                | ureq::Error::Io(_)
        );
        let text = error.to_string();
        if text.contains("certificate") || text.contains("Certificate") {
            return Failure::new(
                EXIT_UNREACHABLE,
                format!(
                    "error: {url}: the daemon's TLS certificate is not trusted: {error} — pass \
                     --ca-cert FILE (or ALLOT_CA_CERT) with the certificate it serves or its CA\n"
                ),
            )
            .into();
        }
        if unreachable {
            return Failure::new(
                EXIT_UNREACHABLE,
                format!(
                    "error: cannot reach the daemon at {url}: {error} — is `allot serve` running at {}? (set --url or ALLOT_URL)\n",
                    self.base
                ),
            )
            .into();
        }
        let code = match &error {
            ureq::Error::BadUri(_) => EXIT_USAGE,
            _ => EXIT_INTERNAL,
        };
        Failure::new(code, format!("error: request to {url} failed: {error}\n")).into()
    }
}

/// The server's error body (or the raw text when it is not an `ApiError`) with the exit code
/// for its status.
pub(crate) fn status_failure(method: &str, path: &str, status: u16, body: &str) -> Failure {
    let code = match status {
        401 | 403 => EXIT_NOT_ALLOWED,
        404 => EXIT_NOT_FOUND,
        400..=499 => EXIT_INVALID,
        _ => EXIT_INTERNAL,
    };
    let mut message = match serde_json::from_str::<ApiError>(body) {
        Ok(api) => {
            let mut m = format!("error: {}", api.error);
            if let Some(field) = &api.field {
                m.push_str(&format!(" (field `{field}`)"));
            }
            if let Some(fix) = &api.fix {
                m.push_str(&format!(" — fix: {fix}"));
            }
            m
        }
        Err(_) if body.trim().is_empty() => format!("error: {method} {path}: HTTP {status}"),
        Err(_) => format!("error: {method} {path}: HTTP {status}: {}", body.trim()),
    };
    if code == EXIT_NOT_ALLOWED && !message.contains("fix:") {
        message.push_str(" — fix: pass a token with --token or ALLOT_TOKEN (`allot token create`)");
    }
    message.push('\n');
    Failure::new(code, message)
}

fn decode<T: DeserializeOwned>(path: &str, text: &str) -> Result<Json<T>> {
    let raw: serde_json::Value = serde_json::from_str(text)
        .with_context(|| format!("the daemon's answer to {path} is not JSON"))?;
    let value = T::deserialize(&raw).with_context(|| {
        format!("the daemon's answer to {path} does not match this allot's API version")
    })?;
    Ok(Json { value, raw, text: text.to_string(), edited: false })
}

fn load_ca(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>> {
    let pem = std::fs::read(path).map_err(|e| {
        Failure::new(
            EXIT_INVALID,
            format!(
                "{}: cannot read the CA certificate: {e} — fix: pass a PEM file to --ca-cert\n",
                path.display()
            ),
        )
    })?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(cert)) => certs.push(cert.to_owned()),
            Ok(_) => {}
            Err(e) => {
                return Err(Failure::new(
                    EXIT_INVALID,
                    format!("{}: not a PEM certificate: {e}\n", path.display()),
                )
                .into());
            }
        }
    }
    if certs.is_empty() {
        return Err(Failure::new(
            EXIT_INVALID,
            format!(
                "{}: no certificate in the file — fix: pass a PEM file with a `BEGIN CERTIFICATE` block\n",
                path.display()
            ),
        )
        .into());
    }
    Ok(certs)
}

/// Percent-encodes a query value (project and user names are free text).
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_exit_codes() {
        let body = r#"{"error":"no workload 7","fix":"list them with `allot ls`"}"#;
        let f = status_failure("GET", "/workloads/7", 404, body);
        assert_eq!(f.code, EXIT_NOT_FOUND);
        assert_eq!(f.message, "error: no workload 7 — fix: list them with `allot ls`\n");
        assert_eq!(status_failure("GET", "/x", 401, "").code, EXIT_NOT_ALLOWED);
        assert!(status_failure("GET", "/x", 403, "").message.contains("--token"));
        let f = status_failure("POST", "/workloads", 422, r#"{"error":"bad","field":"gpus"}"#);
        assert_eq!((f.code, f.message.as_str()), (EXIT_INVALID, "error: bad (field `gpus`)\n"));
        assert_eq!(status_failure("POST", "/x", 409, "").code, EXIT_INVALID);
        let f = status_failure("GET", "/x", 500, "boom");
        assert_eq!(
            (f.code, f.message.as_str()),
            (EXIT_INTERNAL, "error: GET /x: HTTP 500: boom\n")
        );
    }

    #[test]
    fn json_is_reindented_in_the_servers_key_order() {
        let text = r#"{"z":1, "a":[],"s":"x,{\":y","l":[1,{"k":{}}]}"#;
        let pretty = reindent(text);
        assert_eq!(
            pretty,
            "{\n  \"z\": 1,\n  \"a\": [],\n  \"s\": \"x,{\\\":y\",\n  \"l\": [\n    1,\n    {\n      \"k\": {}\n    }\n  ]\n}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&pretty).expect("still JSON");
        assert_eq!(parsed, serde_json::from_str::<serde_json::Value>(text).expect("JSON"));
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("team a/b&c"), "team%20a%2Fb%26c");
        assert_eq!(encode("ml-1_x.y"), "ml-1_x.y");
    }
}
