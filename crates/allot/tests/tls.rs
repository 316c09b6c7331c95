//! `allot serve --tls-cert --tls-key`: the CLI talks to it over HTTPS when it trusts the
//! certificate (`--ca-cert`) and refuses it otherwise; plain HTTP gets no answer; a bad key is
//! refused before anything starts. The certificates are made here, at test time, with rcgen.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_allot");

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allot-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make the test's temp dir");
    dir
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem) in `dir`.
fn self_signed(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("rcgen makes a certificate");
    let cert = dir.join(format!("{stem}-cert.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    std::fs::write(&cert, made.cert.pem()).expect("write the certificate");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("write the key");
    (cert, key)
}

fn serve_command(data_dir: &Path, cert: &Path, key: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--single-user"])
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .arg("--inventory")
        .arg(repo_file("examples/cluster.yaml"))
        .arg("--policy")
        .arg(repo_file("examples/policy.yaml"));
    command
}

/// Waits up to 20 s for `child` to exit; kills it and fails the test if it does not.
fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    for _ in 0..400 {
        if let Some(status) = child.try_wait().expect("poll the child") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not exit within 20 s");
}

/// `allot serve` over HTTPS on a free port: the child, its address and the admin token.
fn start_daemon(data_dir: &Path, cert: &Path, key: &Path) -> (Child, String, String) {
    let (child, addr, token) = common::spawn_serve(serve_command(data_dir, cert, key), "https");
    (child, addr, token.expect("a first start prints a token"))
}

fn cli(url: &str, token: &str, ca_cert: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.arg("--url").arg(url);
    if let Some(ca) = ca_cert {
        command.arg("--ca-cert").arg(ca);
    }
    command
        .args(args)
        .env("ALLOT_TOKEN", token)
        .env_remove("ALLOT_CA_CERT")
        .env_remove("ALLOT_URL")
        .output()
        .expect("allot runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_cli_talks_https_to_a_daemon_it_trusts_and_only_then() {
    let dir = temp_dir("serve");
    let (cert, key) = self_signed(&dir, "server");
    let (mut daemon, addr, token) = start_daemon(&dir.join("data"), &cert, &key);
    let url = format!("https://{addr}");

    let trusted = cli(&url, &token, Some(&cert), &["ls", "--output", "json"]);
    let untrusted = cli(&url, &token, None, &["ls", "--output", "json"]);
    let plain_cli = cli(&format!("http://{addr}"), &token, None, &["ls", "--output", "json"]);
    // A hand-written plain HTTP request: the server answers with no HTTP at all.
    let plain_raw = {
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(15))).expect("read timeout");
        // The server may already have dropped the connection (a reset): no HTTP either way.
        let _ = write!(
            stream,
            "GET /api/v1/openapi.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer); // a reset is as good as a close here
        answer
    };

    let _ = Command::new("kill").arg("-TERM").arg(daemon.id().to_string()).status();
    let exit = wait_exit(&mut daemon, "allot serve after SIGTERM");

    assert!(trusted.status.success(), "with --ca-cert: {}", text(&trusted.stderr));
    let listed: Value = serde_json::from_slice(&trusted.stdout).expect("ls prints JSON");
    assert!(listed["workloads"].is_array(), "{listed}");
    assert!(!untrusted.status.success(), "without --ca-cert the certificate must not be trusted");
    assert!(!text(&untrusted.stderr).is_empty(), "a refused certificate says why");
    assert!(!plain_cli.status.success(), "plain HTTP to the TLS port must fail");
    assert!(!plain_raw.starts_with(b"HTTP/"), "plain HTTP got an answer: {}", text(&plain_raw));
    assert!(exit.success(), "allot serve stops cleanly on SIGTERM: {exit}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `allot serve` with files that must be refused; returns its stderr.
fn refused(dir: &Path, cert: &Path, key: &Path) -> String {
    let data_dir = dir.join("data");
    let mut child = serve_command(&data_dir, cert, key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot serve starts");
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    let exit = wait_exit(&mut child, "allot serve with a bad key");
    assert!(!exit.success(), "allot serve must refuse: {stderr}");
    assert!(!stderr.contains("listening on"), "nothing may start: {stderr}");
    assert!(!data_dir.exists(), "nothing may start, not even the data directory: {stderr}");
    stderr
}

#[test]
fn a_key_file_without_a_key_is_refused_by_name() {
    let dir = temp_dir("nokey");
    let (cert, _) = self_signed(&dir, "server");
    // A file that holds a certificate but no key: a common mix-up of the two options.
    let stderr = refused(&dir, &cert, &cert);
    assert!(
        stderr.contains(&format!("--tls-key {}: no private key found in it", cert.display())),
        "{stderr}"
    );
    assert!(stderr.contains("give a PEM PKCS#8, RSA or EC key"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_key_of_another_certificate_is_refused_naming_both_files() {
    let dir = temp_dir("mismatch");
    let (cert, _) = self_signed(&dir, "server");
    let (_, other_key) = self_signed(&dir, "other");
    let stderr = refused(&dir, &cert, &other_key);
    assert!(stderr.contains(&format!("--tls-key {}", other_key.display())), "{stderr}");
    assert!(stderr.contains(&format!("--tls-cert {}", cert.display())), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}
