//! Where the first requests with a key postguard does not know yet meet
//! (`auth.verify_unknown_keys`, docs/live-api.md): the object named by the
//! id the key would have. One of them leads — asks the origin — and the
//! others wait here for its outcome, so one key costs the origin one call
//! however many requests arrive together. The core decides each step
//! (`key_verify::step`, `key_verify::settle`).
//!
//! Kept in memory only: the object stays loaded while requests come, and
//! an object evicted meanwhile at worst asks once more. A made-up key
//! therefore writes nothing to storage.

use std::cell::RefCell;

use futures_channel::oneshot;
use postguard_core::guard::{VerifiedRequest, VerifyRequest};
use postguard_core::key_verify::{self, Asked, Outcome, Step};

use crate::runtime::{now_ms, within};

#[derive(Default)]
pub struct Rendezvous {
    asked: RefCell<Asked>,
    waiters: RefCell<Vec<oneshot::Sender<Option<Outcome>>>>,
}

impl Rendezvous {
    /// A request's step: `Lead` or `Decided` (a wait ends in one of them —
    /// the lead's outcome, or the lead itself when its lease ran out).
    pub async fn verify(&self, r: &VerifyRequest) -> Step {
        loop {
            let now = now_ms();
            let step = key_verify::step(&self.asked.borrow(), now);
            let until = match step {
                Step::Wait { until } => until,
                Step::Lead => {
                    self.asked.borrow_mut().lead_until = Some(now.saturating_add(r.lease_ms));
                    return Step::Lead;
                }
                decided => return decided,
            };
            let (tx, rx) = oneshot::channel();
            self.waiters.borrow_mut().push(tx);
            // The lead's outcome; none (it gave up) or no answer by the end
            // of its lease: step again.
            if let Some(Ok(Some(outcome))) = within(until.saturating_sub(now), rx).await {
                return Step::Decided(outcome);
            }
        }
    }

    /// The lead's outcome: remembered as the core says, and told to every
    /// request waiting (none: the lead gave up, and they step again).
    pub fn verified(&self, r: &VerifiedRequest) {
        let next = key_verify::settle(
            &self.asked.borrow(),
            r.outcome.as_ref(),
            r.negative_ms,
            now_ms(),
        );
        *self.asked.borrow_mut() = next;
        for waiter in self.waiters.borrow_mut().drain(..) {
            // A waiter whose wait ended has dropped its receiver: nothing to tell.
            let _ = waiter.send(r.outcome.clone());
        }
    }
}
