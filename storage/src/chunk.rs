use std::io::{Read, Write};

use foyer::Code;

/// Identifies one chunk of one stored body.
///
/// `object` is stable for a cache key and variant; `generation` is unique for every body ever stored, so keys
/// are immutable: a new body for the same object gets new chunk keys and old chunks can only ever miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkKey {
    /// [`crate::Store::object_id`] of the cache key and variant.
    pub object: u64,
    /// The body's generation ([`crate::ObjectMeta::generation`]).
    pub generation: u64,
    /// The chunk's position in the body, from 0.
    pub index: u32,
}

const ENCODED_LEN: usize = 8 + 8 + 4;

impl Code for ChunkKey {
    fn encode(&self, writer: &mut impl Write) -> foyer::Result<()> {
        let mut buf = [0u8; ENCODED_LEN];
        buf[..8].copy_from_slice(&self.object.to_le_bytes());
        buf[8..16].copy_from_slice(&self.generation.to_le_bytes());
        buf[16..].copy_from_slice(&self.index.to_le_bytes());
        writer.write_all(&buf).map_err(foyer::Error::io_error)
    }

    fn decode(reader: &mut impl Read) -> foyer::Result<Self> {
        let mut buf = [0u8; ENCODED_LEN];
        reader
            .read_exact(&mut buf)
            .map_err(foyer::Error::io_error)?;
        Ok(Self {
            object: u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")),
            generation: u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
            index: u32::from_le_bytes(buf[16..].try_into().expect("4 bytes")),
        })
    }

    fn estimated_size(&self) -> usize {
        ENCODED_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let key = ChunkKey {
            object: u64::MAX - 3,
            generation: 42,
            index: 7,
        };
        let mut buf = Vec::new();
        key.encode(&mut buf).unwrap();
        assert_eq!(buf.len(), key.estimated_size());
        assert_eq!(ChunkKey::decode(&mut buf.as_slice()).unwrap(), key);
    }
}
