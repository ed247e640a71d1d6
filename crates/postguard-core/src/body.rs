//! The request body limit, as a pure decision: every body the gateway reads
//! (proxied or for one of its own endpoints) goes through one bounded reader
//! (`src/request.rs`) that asks these functions, chunk by chunk, whether to go
//! on. The reader stops at the first chunk that crosses the limit, so no more
//! than `max + one chunk` is ever held, and the origin never sees the body.

/// What a declared `Content-Length` means for reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// No length declared (chunked): read with a [`Budget`].
    Unknown,
    /// Declared within the limit: the runtime enforces the framing, so the
    /// body can be read in one call.
    Fits,
    /// Declared over the limit: answer 413 without reading a byte.
    TooLarge,
}

/// Classifies a request by its declared length.
pub fn declared(content_length: Option<u64>, max: u64) -> Declared {
    match content_length {
        None => Declared::Unknown,
        Some(n) if n > max => Declared::TooLarge,
        Some(_) => Declared::Fits,
    }
}

/// The body crossed the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

/// A body read chunk by chunk under `max` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    max: u64,
    seen: u64,
}

impl Budget {
    pub fn new(max: u64) -> Self {
        Budget { max, seen: 0 }
    }

    /// Accounts for the next chunk: `Err` as soon as the total crosses the
    /// limit (the reader must then stop and drop what it holds).
    pub fn take(&mut self, chunk_len: usize) -> Result<(), TooLarge> {
        self.seen = self.seen.saturating_add(chunk_len as u64);
        match self.seen > self.max {
            true => Err(TooLarge),
            false => Ok(()),
        }
    }

    /// Bytes accepted so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn declared_lengths() {
        assert_eq!(declared(None, 10), Declared::Unknown);
        assert_eq!(declared(Some(10), 10), Declared::Fits);
        assert_eq!(declared(Some(0), 10), Declared::Fits);
        assert_eq!(declared(Some(11), 10), Declared::TooLarge);
        assert_eq!(declared(Some(u64::MAX), 10), Declared::TooLarge);
    }

    #[test]
    fn exactly_the_limit_fits_one_more_byte_does_not() {
        let mut b = Budget::new(10);
        assert_eq!(b.take(4), Ok(()));
        assert_eq!(b.take(6), Ok(()));
        assert_eq!(b.take(0), Ok(()));
        assert_eq!(b.take(1), Err(TooLarge));
    }

    proptest! {
        /// The reader stops at the first chunk that crosses the limit: what it
        /// accepted never exceeds `max`, and it stops iff the total does.
        #[test]
        fn stops_at_the_first_crossing_chunk(
            max in 0u64..10_000,
            chunks in proptest::collection::vec(0usize..3_000, 0..50),
        ) {
            let mut b = Budget::new(max);
            let mut accepted = 0u64;
            let mut stopped_at = None;
            for (i, c) in chunks.iter().enumerate() {
                match b.take(*c) {
                    Ok(()) => accepted += *c as u64,
                    Err(TooLarge) => { stopped_at = Some(i); break; }
                }
            }
            prop_assert!(accepted <= max);
            let total: u64 = chunks.iter().map(|c| *c as u64).sum();
            prop_assert_eq!(stopped_at.is_some(), total > max);
            if let Some(i) = stopped_at {
                let before: u64 = chunks[..i].iter().map(|c| *c as u64).sum();
                prop_assert!(before <= max && before + chunks[i] as u64 > max);
            }
        }
    }
}
