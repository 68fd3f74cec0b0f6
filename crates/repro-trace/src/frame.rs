//! Record framing: each record is `u32le length | u32le crc32 | payload`, where the CRC-32
//! (IEEE) covers the four length bytes and the payload. A reader can therefore tell a record
//! cut short by a crash (the file ends inside it) from a damaged one (the checksum fails).

use crate::format::MAX_RECORD_BYTES;
use std::io::{self, Read, Write};

/// Bytes before each payload.
pub const FRAME_HEADER_LEN: usize = 8;

/// Appends one framed record to `out`.
pub fn write_frame(out: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_RECORD_BYTES)
        .ok_or_else(|| io::Error::other("record larger than the format's limit"))?;
    let len_bytes = len.to_le_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&len_bytes);
    crc.update(payload);
    let mut buf = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    buf.extend_from_slice(&len_bytes);
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
    buf.extend_from_slice(payload);
    // One write per record: a crash leaves either the whole record or a prefix of it.
    out.write_all(&buf)
}

/// What reading the next frame found.
#[derive(Debug)]
pub enum Frame {
    /// A complete record whose checksum holds.
    Record(Vec<u8>),
    /// The file ended cleanly between records.
    End,
    /// The file ended inside a record: the writer stopped mid-write.
    Truncated,
    /// The record is damaged; the string says how.
    Corrupt(String),
}

/// Reads the next frame. Never allocates more than `MAX_RECORD_BYTES` for one record, and only
/// after the length field has been checked against that limit.
pub fn read_frame(input: &mut impl Read) -> io::Result<Frame> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    let got = read_full(input, &mut header)?;
    if got == 0 {
        return Ok(Frame::End);
    }
    if got < FRAME_HEADER_LEN {
        return Ok(Frame::Truncated);
    }
    let len = u32::from_le_bytes(header[..4].try_into().unwrap());
    let expected_crc = u32::from_le_bytes(header[4..].try_into().unwrap());
    if len > MAX_RECORD_BYTES {
        return Ok(Frame::Corrupt(format!("record length {len} exceeds the limit of {MAX_RECORD_BYTES} bytes")));
    }
    let mut payload = vec![0u8; len as usize];
    if read_full(input, &mut payload)? < payload.len() {
        return Ok(Frame::Truncated);
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[..4]);
    crc.update(&payload);
    let actual = crc.finalize();
    if actual != expected_crc {
        return Ok(Frame::Corrupt(format!("checksum mismatch (stored {expected_crc:08x}, computed {actual:08x})")));
    }
    Ok(Frame::Record(payload))
}

/// Reads until `buf` is full or the input ends; returns how many bytes were read.
pub(super) fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, payload).unwrap();
        out
    }

    #[test]
    fn round_trip_then_end() {
        let mut bytes = framed(b"hello");
        bytes.extend(framed(b""));
        let mut r = &bytes[..];
        assert!(matches!(read_frame(&mut r).unwrap(), Frame::Record(p) if p == b"hello"));
        assert!(matches!(read_frame(&mut r).unwrap(), Frame::Record(p) if p.is_empty()));
        assert!(matches!(read_frame(&mut r).unwrap(), Frame::End));
    }

    #[test]
    fn every_proper_prefix_reads_as_truncated() {
        let bytes = framed(b"some record");
        for cut in 1..bytes.len() {
            let mut r = &bytes[..cut];
            assert!(matches!(read_frame(&mut r).unwrap(), Frame::Truncated), "cut at {cut}");
        }
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let bytes = framed(b"a record worth protecting");
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                let mut r = &damaged[..];
                let frame = read_frame(&mut r).unwrap();
                assert!(
                    matches!(frame, Frame::Corrupt(_) | Frame::Truncated),
                    "flip of bit {bit} in byte {i} went unnoticed: {frame:?}"
                );
            }
        }
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut bytes = (MAX_RECORD_BYTES + 1).to_le_bytes().to_vec();
        bytes.extend([0u8; 4]);
        let mut r = &bytes[..];
        assert!(matches!(read_frame(&mut r).unwrap(), Frame::Corrupt(m) if m.contains("exceeds")));
    }
}
