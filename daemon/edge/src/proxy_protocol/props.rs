//! Property tests (the fuzz target `proxy_protocol`): bytes from the network, split at any points, never
//! panic the reader, never name a client unless they start with a real PROXY header, and a real header
//! followed by the client's data yields the sender's client and every byte of that data.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::FutureExt;
use proptest::prelude::*;
use tokio::io::ReadBuf;

use super::*;

/// A connection that hands out its bytes in the given pieces, one read each (a piece larger than the
/// reader's buffer is handed out over several reads), then end of stream.
struct Pieces(VecDeque<Vec<u8>>);

impl Pieces {
    fn new(bytes: &[u8], cuts: &[usize]) -> Self {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = VecDeque::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            if cut > from {
                pieces.push_back(bytes[from..cut].to_vec());
                from = cut;
            }
        }
        Self(pieces)
    }

    fn remaining(self) -> Vec<u8> {
        self.0.into_iter().flatten().collect()
    }
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut piece) = self.0.pop_front() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                self.0.push_front(piece.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads a header from pieces that are all there: the reader must decide without waiting for more.
fn read_all(io: &mut Pieces) -> Result<ProxyHeader, ProxyHeaderError> {
    read(io)
        .now_or_never()
        .expect("a reader with every byte at hand returned Pending")
}

const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(any::<usize>(), 0..8)
}

fn address() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| (ip, port).into()),
        (any::<[u16; 8]>(), any::<u16>()).prop_map(|(ip, port)| (ip, port).into()),
    ]
}

fn v1_line(src: SocketAddr, dst_port: u16) -> Vec<u8> {
    let (family, dst) = match src {
        SocketAddr::V4(_) => ("TCP4", "192.0.2.1"),
        SocketAddr::V6(_) => ("TCP6", "2001:db8::1"),
    };
    format!(
        "PROXY {family} {} {dst} {} {dst_port}\r\n",
        src.ip(),
        src.port()
    )
    .into_bytes()
}

fn v2_header(src: SocketAddr, dst_port: u16, tlv: &[u8]) -> Vec<u8> {
    let dst: SocketAddr = match src {
        SocketAddr::V4(_) => ([192, 0, 2, 1], dst_port).into(),
        SocketAddr::V6(_) => ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], dst_port).into(),
    };
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        v2::Addresses::from((src, dst)),
    )
    .write_tlv(v2::Type::NoOp, tlv)
    .unwrap()
    .build()
    .unwrap()
}

proptest! {
    #[test]
    fn fuzz_proxy_protocol_garbage(bytes in any::<Vec<u8>>(), cuts in cuts()) {
        let mut io = Pieces::new(&bytes, &cuts);
        let got = read_all(&mut io);
        let signed = bytes.starts_with(b"PROXY ") || bytes.starts_with(V2_SIGNATURE);
        prop_assert!(signed || got.is_err(), "{:?} from {:?}", got, bytes);
    }

    #[test]
    fn fuzz_proxy_protocol_near_misses(
        src in address(),
        dst_port in any::<u16>(),
        v2 in any::<bool>(),
        tlv in prop::collection::vec(any::<u8>(), 0..64),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cuts in cuts(),
    ) {
        // A real header with a few bytes changed: the reader may accept it (a changed port is still a
        // header), but must not panic, and what it passes on is always what followed the header.
        let mut bytes = if v2 { v2_header(src, dst_port, &tlv) } else { v1_line(src, dst_port) };
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let mut io = Pieces::new(&bytes, &cuts);
        if let Ok(h) = read_all(&mut io) {
            let mut rest = h.rest.to_vec();
            rest.extend(io.remaining());
            prop_assert!(rest.len() < bytes.len() && bytes.ends_with(&rest));
        }
    }

    #[test]
    fn fuzz_proxy_protocol_real_headers(
        src in address(),
        dst_port in any::<u16>(),
        v2 in any::<bool>(),
        tlv in prop::collection::vec(any::<u8>(), 0..256),
        data in prop::collection::vec(any::<u8>(), 0..512),
        cuts in cuts(),
    ) {
        let mut bytes = if v2 { v2_header(src, dst_port, &tlv) } else { v1_line(src, dst_port) };
        bytes.extend_from_slice(&data);
        let mut io = Pieces::new(&bytes, &cuts);
        let got = read_all(&mut io).unwrap_or_else(|e| panic!("{e} for {bytes:?}"));
        prop_assert_eq!(got.client, Some(src));
        let mut rest = got.rest.to_vec();
        rest.extend(io.remaining());
        prop_assert_eq!(rest, data);
    }
}

#[test]
fn fuzz_proxy_protocol_corpus() {
    for (at, bytes) in lacquer_corpus::cases("proxy_protocol") {
        // Each seed is tried whole and cut at every point.
        for cut in 0..=bytes.len() {
            let mut io = Pieces::new(&bytes, &[cut]);
            let signed = bytes.starts_with(b"PROXY ") || bytes.starts_with(V2_SIGNATURE);
            if let Ok(h) = read_all(&mut io) {
                assert!(signed, "{at}: a client from garbage: {h:?}");
            }
        }
    }
}
