//! HTTPS for `allot serve --tls-cert CERT --tls-key KEY`: rustls with the *ring* provider, its
//! safe defaults (TLS 1.2 and 1.3), no client certificates.
//!
//! The API is served by the same `axum::serve` as plain HTTP, through [`TlsListener`]: a
//! background task accepts TCP connections and runs each handshake in a task of its own, so a slow
//! or silent client never holds up the others; finished handshakes queue for `axum::serve`.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the kernel's accept queue.
const HANDSHAKES_MAX: usize = 256;
/// Finished handshakes waiting for `axum::serve` to take them.
const READY_MAX: usize = 64;
/// Pause after an accept error that is not the client's fault (e.g. out of file descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Reads the PEM certificate chain and private key and makes the server's TLS configuration.
/// Every error names the file and the option, and says what to give instead.
pub(crate) fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>> {
    let chain = read_chain(cert_file)?;
    let key = read_key(key_file)?;
    let provider = Arc::new(ring::default_provider());
    // Checked apart from the pairing below, so that each error blames the right file.
    provider.key_provider.load_private_key(key.clone_key()).map_err(|e| {
        anyhow!(
            "--tls-key {}: not a usable private key ({e}); give a PEM PKCS#8, RSA or EC key",
            key_file.display()
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("TLS setup failed: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            anyhow!(
                "--tls-key {} does not go with --tls-cert {}: {e}; give the private key of the first certificate in the chain",
                key_file.display(),
                cert_file.display()
            )
        })?;
    // axum::serve speaks HTTP/1.1 here; say so, so that clients offering h2 fall back cleanly.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_file(option: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow!("{option} {}: cannot read it: {e}", path.display()))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read_file("--tls-cert", path)?;
    let chain = CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>().map_err(
        |e| {
            anyhow!(
                "--tls-cert {}: not valid PEM ({e}); give a PEM certificate chain (-----BEGIN CERTIFICATE-----), the server's certificate first",
                path.display()
            )
        },
    )?;
    if chain.is_empty() {
        return Err(anyhow!(
            "--tls-cert {}: no certificate found in it; give a PEM certificate chain (-----BEGIN CERTIFICATE-----), the server's certificate first",
            path.display()
        ));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read_file("--tls-key", path)?;
    // The first PKCS#8, PKCS#1 (RSA) or SEC1 (EC) key in the file; certificates are skipped.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => anyhow!(
            "--tls-key {}: no private key found in it; give a PEM PKCS#8, RSA or EC key",
            path.display()
        ),
        e => anyhow!(
            "--tls-key {}: not valid PEM ({e}); give a PEM PKCS#8, RSA or EC key",
            path.display()
        ),
    })
}

/// A listener for `axum::serve` that yields connections whose TLS handshake has finished.
/// Dropping it stops accepting.
#[derive(Debug)]
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(READY_MAX);
        let acceptor = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), sender));
        Ok(Self { ready, local_addr, acceptor })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped; never reached while it
            // lives, and `accept` has no way to report an end.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if client_side(&e) => continue,
            Err(e) => {
                crate::os::tracing_log(&format!("accepting a connection failed: {e}"));
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    // Fails only when the server is shutting down; the connection just closes.
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(e)) => {
                    crate::os::tracing_log(&format!("TLS handshake with {peer} failed: {e}"))
                }
                Err(_) => crate::os::tracing_log(&format!(
                    "TLS handshake with {peer} timed out after {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                )),
            }
        });
    }
}

/// Accept errors caused by one client (it went away before we took it); the next accept works.
fn client_side(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write test file");
        path
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("allot-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make temp dir");
        dir
    }

    #[test]
    fn a_file_without_a_key_is_refused_by_name() {
        let dir = temp_dir("nokey");
        let cert = write(&dir, "cert.pem", "not a certificate\n");
        let key = write(
            &dir,
            "key.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let e = read_key(&key).expect_err("no key in the file").to_string();
        assert!(e.contains(&format!("--tls-key {}", key.display())), "{e}");
        assert!(e.contains("no private key found"), "{e}");
        let e = read_chain(&cert).expect_err("no certificate in the file").to_string();
        assert!(e.contains(&format!("--tls-cert {}", cert.display())), "{e}");
        assert!(e.contains("no certificate found"), "{e}");
        let e = server_config(&dir.join("missing.pem"), &key).expect_err("missing").to_string();
        assert!(e.contains("missing.pem: cannot read it"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
