//! What every CLI test needs: the repository root, the built binary run from it, its output
//! as text.
#![allow(dead_code)] // each test file uses its own subset

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `allot` with `args` from the repository root.
pub fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run allot")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Spawns `allot serve` from `command` (its output is piped here), waits for the line
/// `listening on SCHEME://ADDR`, keeps draining both pipes so the daemon never blocks, and
/// returns the child, ADDR and the admin token it prints on a first start (else `None`).
/// A daemon that never says where it listens is killed and its stderr shown.
pub fn spawn_serve(
    mut command: Command,
    scheme: &str,
) -> (std::process::Child, String, Option<String>) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child =
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("allot serve starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let marker = format!("listening on {scheme}://");
    let mut addr = None;
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        if let Some(rest) = line.split(marker.as_str()).nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
        seen.push(line);
    }
    std::thread::spawn(move || for _ in lines {});
    let Some(addr) = addr else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("allot serve printed no {scheme}:// address; stderr:\n{}", seen.join("\n"));
    };
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.trim().starts_with("allot_") {
                let _ = tx.send(line.trim().to_string());
            }
        }
    });
    let token = rx.recv_timeout(std::time::Duration::from_millis(1000)).ok();
    (child, addr, token)
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    // Chunked bodies: good enough to find JSON inside for these tests.
    let body = if response.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    };
    Ok((status, body))
}

pub fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Serves `page` (as it is at each request) as an exporter's `/metrics` on loopback, for
/// `--telemetry dcgm-exporter=URL`; the URL.
pub fn serve_page(page: std::sync::Arc<std::sync::Mutex<String>>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 2048];
            let _ = stream.read(&mut request);
            let page = page.lock().map(|p| p.clone()).unwrap_or_default();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    url
}

/// `line` (an exporter's sample line, or its label list) with label `key` set to `value`.
pub fn set_label(line: &str, key: &str, value: &str) -> String {
    for start in ["{", ","] {
        let needle = format!("{start}{key}=\"");
        if let Some(i) = line.find(&needle) {
            let from = i + needle.len();
            let to = from + line[from..].find('"').expect("a closing quote");
            return format!("{}{value}{}", &line[..from], &line[to..]);
        }
    }
    panic!("no label {key} in {line}");
}
