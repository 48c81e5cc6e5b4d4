//! The PROXY protocol header (v1 text, v2 binary) a load balancer in front writes before the client's bytes.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::{AsyncRead, AsyncReadExt};

/// v2 allows 16 + 65535 bytes; nothing legitimate comes close, and v1 is at most 107.
const MAX_HEADER: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyHeaderError {
    #[error("the connection closed before a complete PROXY header")]
    Truncated,
    #[error("no valid PROXY header")]
    Invalid,
    #[error("PROXY header longer than {MAX_HEADER} bytes")]
    TooLong,
}

/// What the header says about the connection, and the bytes read past it (the start of the client's data).
#[derive(Debug, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The original client; `None` for a `LOCAL` or `UNKNOWN` connection (the sender's own health check),
    /// which keeps the peer's address.
    pub client: Option<SocketAddr>,
    pub rest: Bytes,
}

pub async fn read(io: &mut (impl AsyncRead + Unpin)) -> Result<ProxyHeader, ProxyHeaderError> {
    let mut buf = BytesMut::with_capacity(512);
    loop {
        if io
            .read_buf(&mut buf)
            .await
            .map_err(|_| ProxyHeaderError::Truncated)?
            == 0
        {
            return Err(ProxyHeaderError::Truncated);
        }
        let v1 = buf.starts_with(b"PROXY ");
        // ppp judges a v1 line before it has ended: cut after a port's space (`... 51234 `) or after
        // `TCP6`, a header split across two TCP segments would be refused. A v1 line is parsed whole.
        if v1 && !v1_line_ended(&buf) {
            continue;
        }
        let parsed = HeaderResult::parse(&buf);
        if parsed.is_incomplete() {
            // ppp calls a v1 line with a part missing incomplete even once the line has ended.
            if v1 {
                return Err(ProxyHeaderError::Invalid);
            }
            if buf.len() >= MAX_HEADER {
                return Err(ProxyHeaderError::TooLong);
            }
            continue;
        }
        let (len, client) = match parsed {
            HeaderResult::V1(Ok(h)) => (h.header.len(), v1_client(&h.addresses)),
            HeaderResult::V2(Ok(h)) => (h.len(), v2_client(&h)),
            _ => return Err(ProxyHeaderError::Invalid),
        };
        let rest = buf.split_off(len).freeze();
        return Ok(ProxyHeader { client, rest });
    }
}

/// Whether a v1 line is over: its end of line is in (a bare LF ends it too, as a refusal), or it has
/// passed the 107 bytes the format allows.
fn v1_line_ended(buf: &[u8]) -> bool {
    buf.len() >= 107 || buf.contains(&b'\n')
}

fn v1_client(a: &v1::Addresses) -> Option<SocketAddr> {
    match a {
        v1::Addresses::Tcp4(a) => Some((a.source_address, a.source_port).into()),
        v1::Addresses::Tcp6(a) => Some((a.source_address, a.source_port).into()),
        v1::Addresses::Unknown => None,
    }
}

fn v2_client(h: &v2::Header<'_>) -> Option<SocketAddr> {
    if h.command == v2::Command::Local {
        return None;
    }
    match h.addresses {
        v2::Addresses::IPv4(a) => Some((a.source_address, a.source_port).into()),
        v2::Addresses::IPv6(a) => Some((a.source_address, a.source_port).into()),
        v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(chunks: &[&[u8]]) -> Result<ProxyHeader, ProxyHeaderError> {
        let mut builder = tokio_test_io(chunks);
        read(&mut builder).await
    }

    /// A reader that hands out the chunks one read at a time, as a network would.
    fn tokio_test_io(chunks: &[&[u8]]) -> impl AsyncRead + Unpin {
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for c in chunks {
                tx.write_all(&c).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        rx
    }

    fn v2_header(command: v2::Command, src: &str, dst: &str) -> Vec<u8> {
        let addresses: v2::Addresses = (
            src.parse::<SocketAddr>().unwrap(),
            dst.parse::<SocketAddr>().unwrap(),
        )
            .into();
        v2::Builder::with_addresses(v2::Version::Two | command, v2::Protocol::Stream, addresses)
            .write_tlv(v2::Type::Authority, b"example.com")
            .unwrap()
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn table() {
        let v1 = b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\nGET / HTTP/1.1\r\n";
        let got = parse(&[v1]).await.unwrap();
        assert_eq!(got.client, Some("203.0.113.7:51234".parse().unwrap()));
        assert_eq!(&got.rest[..], b"GET / HTTP/1.1\r\n");

        let split = parse(&[b"PROXY TCP6 2001:db8::7 2001:db8::1 ", b"5 443\r\n"])
            .await
            .unwrap();
        assert_eq!(split.client, Some("[2001:db8::7]:5".parse().unwrap()));
        assert!(split.rest.is_empty());

        // Split where ppp alone would judge the line too early: after `TCP6`, after the source port.
        for (head, tail) in [
            (
                &b"PROXY TCP6"[..],
                &b" 2001:db8::7 2001:db8::1 5 443\r\n"[..],
            ),
            (b"PROXY TCP6 2001:db8::7 2001:db8::1 5 ", b"443\r\n"),
        ] {
            let got = parse(&[head, tail]).await.unwrap();
            assert_eq!(got.client, Some("[2001:db8::7]:5".parse().unwrap()));
        }

        let unknown = parse(&[b"PROXY UNKNOWN\r\n"]).await.unwrap();
        assert_eq!(unknown.client, None);

        let mut v2 = v2_header(v2::Command::Proxy, "198.51.100.9:4000", "192.0.2.1:443");
        v2.extend_from_slice(b"\x16\x03\x01");
        let (head, tail) = v2.split_at(10);
        let got = parse(&[head, tail]).await.unwrap();
        assert_eq!(got.client, Some("198.51.100.9:4000".parse().unwrap()));
        assert_eq!(&got.rest[..], b"\x16\x03\x01");

        let local = v2_header(v2::Command::Local, "127.0.0.1:1", "127.0.0.1:2");
        assert_eq!(parse(&[&local]).await.unwrap().client, None);

        let cases: [(&[&[u8]], ProxyHeaderError); 7] = [
            (&[b"PROXY TCP4 nonsense\r\n"], ProxyHeaderError::Invalid),
            (
                &[
                    &[b'P'; 1][..],
                    &b"ROXY TCP4 1.2.3.4 5.6.7.8 1 2 "[..],
                    &[b' '; 100][..],
                ],
                ProxyHeaderError::Invalid,
            ),
            (
                &[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"],
                ProxyHeaderError::Invalid,
            ),
            (
                &[b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r"],
                ProxyHeaderError::Truncated,
            ),
            (
                &[b"PROXY TCP4 999.2.3.4 5.6.7.8 1 2\r\n"],
                ProxyHeaderError::Invalid,
            ),
            (&[&local[..20]], ProxyHeaderError::Truncated),
            (&[b""], ProxyHeaderError::Truncated),
        ];
        for (chunks, want) in cases {
            assert_eq!(parse(chunks).await.unwrap_err(), want, "{chunks:?}");
        }
    }
}
