//! Time and randomness behind traits, so the retry and throttle decisions can be
//! driven by a fake clock and a fixed random source in tests.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A boxed sleep, as returned by [`Clock::sleep`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Monotonic time and sleeping.
pub trait Clock: Send + Sync {
    /// Monotonic time since an arbitrary origin fixed for this clock.
    fn now(&self) -> Duration;
    /// Wall-clock time since the Unix epoch (for `X-RateLimit-Reset` and webhook timestamps).
    fn unix_now(&self) -> Duration;
    /// Waits for `d`.
    fn sleep(&self, d: Duration) -> Sleep;
}

/// The real clock: `std::time::Instant` and `tokio::time::sleep`.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
    fn unix_now(&self) -> Duration {
        // A clock before 1970 is treated as the epoch rather than failing a request.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
    fn sleep(&self, d: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A source of uniform random numbers in `[0, 1)` (the retry jitter).
pub trait Random: Send + Sync {
    fn unit(&self) -> f64;
}

/// The default random source (`fastrand`, seeded per thread from the OS).
#[derive(Debug, Default, Clone, Copy)]
pub struct FastRandom;

impl Random for FastRandom {
    fn unit(&self) -> f64 {
        fastrand::f64()
    }
}
