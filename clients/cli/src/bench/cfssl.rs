//! The side-by-side: a `cfssl serve` (Cloudflare's CA, storing nothing) driven like Signet,
//! one keep-alive HTTP/1.1 connection per client posting the same CSR to its JSON
//! `/api/v1/cfssl/sign` endpoint. A request counts as issued when cfssl answers 200 with
//! `"success":true`. Plain TCP (`cfssl serve` as most run it) or TLS (`cfssl serve
//! -tls-cert`, the like-for-like with Signet, which is only ever served over TLS), the
//! server's certificate checked against the roots given and the name `localhost`.
//!
//! The HTTP here is the minimum cfssl needs (a request with `Content-Length`, an answer with
//! `Content-Length`); anything else is an error, never a guess.

use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Largest answer read (a certificate in JSON is about 2 KiB).
const MAX_BODY: usize = 1 << 20;

/// A byte stream to cfssl: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One keep-alive connection to `cfssl serve`.
pub(super) struct Conn {
    stream: BufReader<Box<dyn Stream>>,
    request: Vec<u8>,
}

/// The TLS client set-up for a `cfssl serve -tls-cert`: trusts the PEM roots in `roots_pem`.
pub(super) fn tls_config(roots_pem: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for block in pem::parse_many(roots_pem).context("reading the cfssl CA")? {
        if block.tag() == "CERTIFICATE" {
            roots
                .add(block.into_contents().into())
                .context("adding the cfssl CA")?;
        }
    }
    anyhow::ensure!(!roots.is_empty(), "the cfssl CA file holds no certificate");
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

impl Conn {
    /// Connects to `addr` (`host:port`, or `http://host:port`), over TLS when `tls` is given,
    /// and prepares the request that asks for `csr_pem` to be signed.
    pub(super) async fn connect(
        addr: &str,
        csr_pem: &str,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> anyhow::Result<Self> {
        let host = addr
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_owned();
        let tcp = TcpStream::connect(&host)
            .await
            .with_context(|| format!("connecting to cfssl at {host}"))?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match tls {
            None => Box::new(tcp),
            Some(cfg) => {
                let name =
                    rustls::pki_types::ServerName::try_from("localhost").context("server name")?;
                Box::new(
                    tokio_rustls::TlsConnector::from(cfg.clone())
                        .connect(name, tcp)
                        .await
                        .with_context(|| format!("TLS with cfssl at {host}"))?,
                )
            }
        };
        let body = serde_json::json!({ "certificate_request": csr_pem }).to_string();
        let mut request = format!(
            "POST /api/v1/cfssl/sign HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body.as_bytes());
        Ok(Self {
            stream: BufReader::new(stream),
            request,
        })
    }

    /// Asks for one signature; Ok when cfssl returned a certificate.
    pub(super) async fn sign(&mut self) -> anyhow::Result<()> {
        let out = self.stream.get_mut();
        out.write_all(&self.request).await?;
        out.flush().await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut length = None;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("cfssl closed the connection");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = Some(value.trim().parse::<usize>()?);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    bail!("cfssl answered with Transfer-Encoding {}", value.trim());
                }
            }
        }
        let length = length.ok_or_else(|| anyhow!("cfssl's answer has no Content-Length"))?;
        if length > MAX_BODY {
            bail!("cfssl's answer is {length} bytes");
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).await?;
        if status != "200" || !contains(&body, b"\"success\":true") {
            bail!(
                "cfssl answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
        }
        Ok(())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
