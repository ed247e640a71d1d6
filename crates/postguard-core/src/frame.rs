//! The envelope between the worker and its Durable Object: a JSON header and
//! raw bytes in one body (`u32` big-endian header length, header, payload), so
//! response bodies cross without base64 or JSON escaping.

use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame shorter than its header")]
    Truncated,
    #[error("frame header is not valid JSON: {0}")]
    BadHeader(String),
}

pub fn encode<T: Serialize>(meta: &T, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let header = serde_json::to_vec(meta).map_err(|e| FrameError::BadHeader(e.to_string()))?;
    let len = u32::try_from(header.len())
        .map_err(|_| FrameError::BadHeader("header too large".into()))?;
    let mut out = Vec::with_capacity(4 + header.len() + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Splits a frame into its header and payload. The payload is returned as an
/// owned tail of the input without copying the input again.
pub fn decode<T: DeserializeOwned>(mut frame: Vec<u8>) -> Result<(T, Vec<u8>), FrameError> {
    let len_bytes: [u8; 4] = frame
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(FrameError::Truncated)?;
    let len = usize::try_from(u32::from_be_bytes(len_bytes)).map_err(|_| FrameError::Truncated)?;
    let end = 4usize
        .checked_add(len)
        .filter(|e| *e <= frame.len())
        .ok_or(FrameError::Truncated)?;
    let meta =
        serde_json::from_slice(&frame[4..end]).map_err(|e| FrameError::BadHeader(e.to_string()))?;
    let payload = frame.split_off(end);
    Ok((meta, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(meta in proptest::collection::vec(any::<u16>(), 0..20), payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let f = encode(&meta, &payload).unwrap();
            let (m, p): (Vec<u16>, Vec<u8>) = decode(f).unwrap();
            prop_assert_eq!(m, meta);
            prop_assert_eq!(p, payload);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode::<serde_json::Value>(bytes);
        }
    }

    #[test]
    fn truncated() {
        assert_eq!(decode::<u8>(vec![0, 0]), Err(FrameError::Truncated));
        assert_eq!(
            decode::<u8>(vec![0, 0, 0, 9, b'1']),
            Err(FrameError::Truncated)
        );
    }
}
