//! The side-by-side: a `cfssl serve` (Cloudflare's CA, storing nothing) driven like Signet,
//! one keep-alive HTTP/1.1 connection per client posting the same CSR to its JSON
//! `/api/v1/cfssl/sign` endpoint. A request counts as issued when cfssl answers 200 with
//! `"success":true`.
//!
//! The HTTP here is the minimum cfssl needs (a request with `Content-Length`, an answer with
//! `Content-Length`); anything else is an error, never a guess.

use anyhow::{Context, anyhow, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Largest answer read (a certificate in JSON is about 2 KiB).
const MAX_BODY: usize = 1 << 20;

/// One keep-alive connection to `cfssl serve`.
pub(super) struct Conn {
    stream: BufReader<TcpStream>,
    request: Vec<u8>,
}

impl Conn {
    /// Connects to `addr` (`host:port`, or `http://host:port`) and prepares the request that
    /// asks for `csr_pem` to be signed.
    pub(super) async fn connect(addr: &str, csr_pem: &str) -> anyhow::Result<Self> {
        let host = addr
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let tcp = TcpStream::connect(&host)
            .await
            .with_context(|| format!("connecting to cfssl at {host}"))?;
        tcp.set_nodelay(true)?;
        let body = serde_json::json!({ "certificate_request": csr_pem }).to_string();
        let mut request = format!(
            "POST /api/v1/cfssl/sign HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body.as_bytes());
        Ok(Self {
            stream: BufReader::new(tcp),
            request,
        })
    }

    /// Asks for one signature; Ok when cfssl returned a certificate.
    pub(super) async fn sign(&mut self) -> anyhow::Result<()> {
        self.stream.get_mut().write_all(&self.request).await?;
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
