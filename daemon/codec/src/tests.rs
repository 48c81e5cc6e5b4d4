use std::io::Write;

use proptest::prelude::*;

use super::*;

const ALL: [Coding; 3] = [Coding::Br, Coding::Gzip, Coding::Zstd];

fn text(len: usize) -> Vec<u8> {
    let words = [
        "cache ",
        "stale ",
        "<div class=\"x\">",
        "vary ",
        "\n",
        "0123 ",
        "lacquer ",
    ];
    let mut out = Vec::with_capacity(len);
    let mut n = 7u64;
    while out.len() < len {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(words[(n >> 33) as usize % words.len()].as_bytes());
    }
    out.truncate(len);
    out
}

/// Runs `data` through `feed`/`next` in pieces of `piece` bytes, checking the output piece bound.
fn encode(coding: Coding, data: &[u8], piece: usize) -> Vec<u8> {
    let mut e = Encoder::new(coding, 5);
    let mut out = Vec::new();
    for part in data.chunks(piece.max(1)) {
        e.feed(Bytes::copy_from_slice(part));
        while let Some(b) = e.piece().unwrap() {
            assert!(b.len() <= PIECE);
            out.extend_from_slice(&b);
        }
    }
    e.end();
    while let Some(b) = e.piece().unwrap() {
        out.extend_from_slice(&b);
    }
    assert_eq!(e.consumed(), data.len() as u64);
    assert_eq!(e.produced(), out.len() as u64);
    out
}

fn decode(coding: Coding, data: &[u8], piece: usize, limit: u64) -> Result<Vec<u8>, CodecError> {
    let mut d = Decoder::new(coding, limit);
    let mut out = Vec::new();
    for part in data.chunks(piece.max(1)) {
        d.feed(Bytes::copy_from_slice(part));
        while let Some(b) = d.piece()? {
            assert!(b.len() <= PIECE);
            out.extend_from_slice(&b);
        }
    }
    d.end();
    while let Some(b) = d.piece()? {
        out.extend_from_slice(&b);
    }
    assert_eq!(d.produced(), out.len() as u64);
    Ok(out)
}

#[test]
fn round_trips_in_every_coding() {
    for coding in ALL {
        for len in [0, 1, 1000, 70_000, 1 << 20] {
            let data = text(len);
            let coded = encode(coding, &data, 16 * 1024);
            if len >= 1000 {
                assert!(
                    coded.len() * 3 < data.len(),
                    "{coding:?} {len}: {}",
                    coded.len()
                );
            }
            for piece in [1, 7, 4096, 1 << 20] {
                if piece == 1 && len > 70_000 {
                    continue;
                }
                let back = decode(coding, &coded, piece, u64::MAX).unwrap();
                assert!(back == data, "{coding:?} len {len} piece {piece}");
            }
        }
    }
}

#[test]
fn a_flush_gives_out_everything_fed_so_far() {
    for coding in ALL {
        let data = text(300_000);
        let mut e = Encoder::new(coding, 5);
        let mut out = Vec::new();
        e.feed(Bytes::copy_from_slice(&data[..100_000]));
        while let Some(b) = e.piece().unwrap() {
            out.extend_from_slice(&b);
        }
        e.flush();
        while let Some(b) = e.piece().unwrap() {
            out.extend_from_slice(&b);
        }
        // What came out so far decodes to all that went in.
        let mut d = Decoder::new(coding, u64::MAX);
        d.feed(Bytes::from(out.clone()));
        let mut back = Vec::new();
        while let Some(b) = d.piece().unwrap() {
            back.extend_from_slice(&b);
        }
        assert!(
            back == data[..100_000],
            "{coding:?}: {} of 100000",
            back.len()
        );
        e.feed(Bytes::copy_from_slice(&data[100_000..]));
        e.end();
        while let Some(b) = e.piece().unwrap() {
            out.extend_from_slice(&b);
        }
        assert_eq!(decode(coding, &out, 4096, u64::MAX).unwrap(), data);
    }
}

#[test]
fn gzip_from_other_encoders_and_concatenated_members() {
    let data = text(100_000);
    let member = |part: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(part).unwrap();
        e.finish().unwrap()
    };
    let mut two = member(&data[..40_000]);
    two.extend(member(&data[40_000..]));
    assert_eq!(decode(Coding::Gzip, &two, 3000, u64::MAX).unwrap(), data);
}

#[test]
fn an_empty_body_is_empty_in_any_coding() {
    for coding in ALL {
        assert_eq!(decode(coding, b"", 1, 10).unwrap(), b"");
    }
}

#[test]
fn truncated_bodies_fail_at_their_end() {
    let data = text(200_000);
    for coding in ALL {
        let coded = encode(coding, &data, 8192);
        for cut in [1, 10, coded.len() / 2, coded.len() - 1] {
            match decode(coding, &coded[..cut], 4096, u64::MAX) {
                Err(CodecError::Truncated(_)) | Err(CodecError::Corrupt { .. }) => {}
                other => panic!("{coding:?} cut at {cut}: {:?}", other.map(|v| v.len())),
            }
        }
    }
}

#[test]
fn corrupt_bodies_fail() {
    let data = text(50_000);
    for coding in ALL {
        let mut coded = encode(coding, &data, 8192);
        let at = coded.len() / 2;
        for b in &mut coded[at..at + 8] {
            *b ^= 0x5a;
        }
        assert!(
            decode(coding, &coded, 4096, u64::MAX).is_err(),
            "{coding:?}"
        );
        assert!(
            decode(
                coding,
                b"this was never compressed at all, not even once",
                7,
                1 << 20
            )
            .is_err(),
            "{coding:?}"
        );
    }
    // gzip's trailer checks the data: a body whose length field lies is refused.
    let mut coded = encode(Coding::Gzip, &data, 8192);
    let n = coded.len();
    coded[n - 1] ^= 1;
    assert!(matches!(
        decode(Coding::Gzip, &coded, 4096, u64::MAX),
        Err(CodecError::Corrupt { .. })
    ));
}

#[test]
fn trailing_garbage_after_a_brotli_stream_is_corrupt() {
    let mut coded = encode(Coding::Br, &text(5000), 4096);
    coded.extend_from_slice(b"tail");
    assert!(decode(Coding::Br, &coded, 4096, u64::MAX).is_err());
}

#[test]
fn a_bomb_is_cut_off_at_the_limit() {
    // 64 MiB of zeros compresses to some tens of KiB.
    let zeros = vec![0u8; 64 << 20];
    for coding in ALL {
        let coded = encode(coding, &zeros, 1 << 20);
        assert!(coded.len() < 300_000, "{coding:?} {}", coded.len());
        let mut d = Decoder::new(coding, 1 << 20);
        let mut out = 0u64;
        let mut err = None;
        'feed: for part in coded.chunks(16 * 1024) {
            d.feed(Bytes::copy_from_slice(part));
            loop {
                match d.piece() {
                    Ok(Some(b)) => out += b.len() as u64,
                    Ok(None) => break,
                    Err(e) => {
                        err = Some(e);
                        break 'feed;
                    }
                }
            }
        }
        assert!(
            matches!(err, Some(CodecError::TooLarge { .. })),
            "{coding:?}"
        );
        assert!(out <= 1 << 20, "{coding:?} produced {out}");
        // A body exactly at the limit is fine.
        let exact = encode(coding, &zeros[..1 << 20], 1 << 20);
        assert_eq!(
            decode(coding, &exact, 4096, 1 << 20).unwrap().len(),
            1 << 20
        );
    }
}

/// A body that expands a thousand times more than text does is cut after a bounded output, long before
/// the size limit; text passes the same limit whole.
#[test]
fn a_body_past_the_expansion_ratio_is_cut_early() {
    let zeros = vec![0u8; 16 << 20];
    for coding in ALL {
        let coded = encode(coding, &zeros, 1 << 20);
        let mut d = Decoder::new(coding, u64::MAX).with_max_expansion(1000, 1 << 20);
        d.feed(Bytes::from(coded.clone()));
        let mut out = 0u64;
        let err = loop {
            match d.piece() {
                Ok(Some(b)) => out += b.len() as u64,
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        assert!(
            matches!(err, Some(CodecError::Expands { ratio: 1000, .. })),
            "{coding:?}: {err:?} after {out} bytes from {}",
            coded.len()
        );
        let allowed = (1u64 << 20).max(coded.len() as u64 * 1000);
        assert!(out <= allowed, "{coding:?} produced {out}");

        let page = text(4 << 20);
        let coded = encode(coding, &page, 1 << 20);
        let mut d = Decoder::new(coding, u64::MAX).with_max_expansion(1000, 1 << 20);
        let mut out = Vec::new();
        for part in coded.chunks(16 * 1024) {
            d.feed(Bytes::copy_from_slice(part));
            while let Some(b) = d.piece().unwrap() {
                out.extend_from_slice(&b);
            }
        }
        d.end();
        while let Some(b) = d.piece().unwrap() {
            out.extend_from_slice(&b);
        }
        assert!(out == page, "{coding:?}: text decodes whole");
    }
}

/// The memory a decoder is counted for follows the window the stream declares: lacquerd's own encoders
/// use 1 MiB, so their bodies cost far less than the largest windows HTTP allows.
#[test]
fn decoder_memory_follows_the_declared_window() {
    let page = text(3 << 20);
    // Brotli's window is 16 bytes short of its power of two.
    let br = |bits: u32| 2 * ((1u64 << bits) - 16) + (2 << 20);
    for (coding, own, max) in [
        (Coding::Br, br(20), br(24)),
        (Coding::Zstd, 4 << 20, 18 << 20),
    ] {
        let coded = encode(coding, &page, 1 << 20);
        assert_eq!(Decoder::memory(coding, Some(&coded)), own, "{coding:?}");
        assert_eq!(Decoder::memory(coding, None), max, "{coding:?}");
        assert_eq!(Decoder::memory(coding, Some(&[])), max, "{coding:?}");
    }
    // Brotli's own default window (22 bits) and zstd's single-segment frames (window = content size).
    let mut big = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut big, 4096, 5, 22);
        w.write_all(&page).unwrap();
    }
    assert_eq!(Decoder::memory(Coding::Br, Some(&big)), br(22));
    let small = zstd::bulk::compress(&page[..5000], 3).unwrap();
    assert_eq!(
        Decoder::memory(Coding::Zstd, Some(&small)),
        10_000 + (2 << 20)
    );
    assert_eq!(Decoder::memory(Coding::Gzip, None), 128 << 10);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_input_any_pieces(data in proptest::collection::vec(any::<u8>(), 0..20_000), piece in 1usize..5000, which in 0usize..3) {
        let coding = ALL[which];
        let coded = encode(coding, &data, piece);
        prop_assert_eq!(decode(coding, &coded, piece, u64::MAX).unwrap(), data);
    }

    #[test]
    fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4000), which in 0usize..3) {
        let _ = decode(ALL[which], &data, 97, 1 << 16);
    }
}

/// A dictionary coding's stream, as a client holding the dictionary reads it: the magic number, the
/// dictionary's hash, and a brotli or zstd stream that refers back into the dictionary.
fn decode_against(
    coding: DictionaryCoding,
    stream: &[u8],
    dictionary: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let magic = magic(coding);
    assert_eq!(&stream[..magic.len()], magic);
    let hash = stream[magic.len()..magic.len() + 32].to_vec();
    let body = &stream[magic.len() + 32..];
    let mut out = Vec::new();
    match coding {
        DictionaryCoding::Dcb => {
            let mut r =
                brotli::Decompressor::new_with_custom_dict(body, 4096, dictionary.to_vec().into());
            std::io::Read::read_to_end(&mut r, &mut out).unwrap();
        }
        DictionaryCoding::Dcz => {
            let mut r = zstd::stream::read::Decoder::with_dictionary(body, dictionary).unwrap();
            std::io::Read::read_to_end(&mut r, &mut out).unwrap();
        }
    }
    (hash, out)
}

/// `body` fed to `encoder` `piece` bytes at a time, and the whole stream it made.
fn encode_in_pieces(encoder: &mut Encoder, body: &[u8], piece: usize) -> Vec<u8> {
    let mut stream = Vec::new();
    for piece in body.chunks(piece) {
        encoder.feed(Bytes::copy_from_slice(piece));
        while let Some(out) = encoder.piece().unwrap() {
            stream.extend_from_slice(&out);
        }
    }
    encoder.end();
    while let Some(out) = encoder.piece().unwrap() {
        stream.extend_from_slice(&out);
    }
    stream
}

#[test]
fn a_body_coded_against_a_dictionary_decodes_against_it_and_is_far_smaller() {
    // Version 2 of a script, and version 1 as its dictionary: most of it is shared.
    let v1: Vec<u8> = (0..4000)
        .flat_map(|i| format!("function f{i}(a) {{ return a * {i} + {}; }}\n", i % 7).into_bytes())
        .collect();
    let mut v2 = v1.clone();
    v2.extend_from_slice(b"function added() { return 42; }\n");
    v2[100..110].copy_from_slice(b"/*edited*/");
    let hash = [7u8; 32];
    for coding in [DictionaryCoding::Dcb, DictionaryCoding::Dcz] {
        let mut encoder = Encoder::with_dictionary(coding, 5, &v1, &hash).unwrap();
        let stream = encode_in_pieces(&mut encoder, &v2, 10_000);
        assert_eq!(encoder.produced(), stream.len() as u64);
        let (sent_hash, decoded) = decode_against(coding, &stream, &v1);
        assert_eq!(sent_hash, hash);
        assert!(decoded == v2, "{coding:?} decodes to the body");
        // Without the dictionary the same level makes tens of KiB of it; against it, a few hundred bytes.
        let mut plain = Encoder::new(
            match coding {
                DictionaryCoding::Dcb => Coding::Br,
                DictionaryCoding::Dcz => Coding::Zstd,
            },
            5,
        );
        plain.feed(Bytes::from(v2.clone()));
        plain.end();
        while plain.piece().unwrap().is_some() {}
        assert!(
            stream.len() * 20 < plain.produced() as usize,
            "{coding:?}: {} bytes against the dictionary, {} without",
            stream.len(),
            plain.produced()
        );
    }
    let too_large = vec![0u8; MAX_DICTIONARY + 1];
    assert!(Encoder::with_dictionary(DictionaryCoding::Dcb, 5, &too_large, &hash).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Edits of a dictionary (what a new version of a script is), coded against it, decode back: the
    /// brotli encoder's dictionary support is only sound from quality 9, which `dcb` is made at.
    #[test]
    fn edits_of_a_dictionary_round_trip(
        seed in 0u64..1000,
        cuts in proptest::collection::vec((0usize..60_000, 0usize..200, proptest::collection::vec(any::<u8>(), 0..40)), 0..6),
        level in 1u32..=11,
    ) {
        let dictionary = text(60_000 + seed as usize);
        let mut body = dictionary.clone();
        for (at, len, with) in cuts {
            let at = at.min(body.len());
            let end = (at + len).min(body.len());
            body.splice(at..end, with);
        }
        for coding in [DictionaryCoding::Dcb, DictionaryCoding::Dcz] {
            let mut encoder = Encoder::with_dictionary(coding, level, &dictionary, &[1; 32]).unwrap();
            let stream = encode_in_pieces(&mut encoder, &body, 7_000);
            let (_, decoded) = decode_against(coding, &stream, &dictionary);
            prop_assert!(decoded == body, "{:?} at level {}", coding, level);
        }
    }
}
