//! A minimal HTTP/1.1 client (one request per connection, `Connection: close`), enough for JSON
//! requests to the OpenAI-compatible endpoint without another dependency. The OpenAI protocol
//! itself is exercised by the official Python client (`tests/clients/openai_client.py`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A response: status code, lower-cased headers, body (de-chunked).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("a JSON body expected, got {:?}", self.body))
    }
}

/// `POST path` with a JSON body.
pub async fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Result<Response> {
    request(addr, "POST", path, Some(body.to_string()), &[]).await
}

/// `POST path` with a JSON body and extra headers.
pub async fn post_json_with_headers(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> Result<Response> {
    request(addr, "POST", path, Some(body.to_string()), headers).await
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response> {
    request(addr, "GET", path, None, &[]).await
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<String>,
    headers: &[(&str, &str)],
) -> Result<Response> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "refusing a non-loopback address {addr}"
    );
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n"
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = &body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        // A server may answer before it read the whole body (413 on a declared length past
        // its limit) and close: as HTTP clients do, read that answer when sending fails.
        let sent = async {
            stream.write_all(head.as_bytes()).await?;
            if let Some(b) = &body {
                stream.write_all(b.as_bytes()).await?;
            }
            std::io::Result::Ok(())
        }
        .await;
        let mut raw = Vec::new();
        let read = stream.read_to_end(&mut raw).await;
        match (sent, read) {
            (_, Ok(_)) if !raw.is_empty() => parse(&raw),
            (Err(e), _) => Err(e.into()),
            (Ok(()), Err(e)) => Err(e.into()),
            (Ok(()), Ok(_)) => parse(&raw),
        }
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("{method} {path} on {addr}: no response within {TIMEOUT:?}"))?
}

fn parse(raw: &[u8]) -> Result<Response> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let body = String::from_utf8(body).context("the body is not UTF-8")?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut s: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = s
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk size")?;
        let line = String::from_utf8_lossy(&s[..eol]);
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {line:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let rest = &s[eol + 2..];
        let Some(chunk) = rest.get(..size) else {
            bail!("truncated chunk");
        };
        out.extend_from_slice(chunk);
        s = rest.get(size..).unwrap_or_default();
        s = s.strip_prefix(b"\r\n").unwrap_or(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let plain = parse(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}").expect("plain");
        assert_eq!((plain.status, plain.body.as_str()), (404, "{}"));
        let chunked = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .expect("chunked");
        assert_eq!((chunked.status, chunked.body.as_str()), (200, "abcde"));
    }
}
