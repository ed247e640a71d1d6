//! A `KeyGuard` object in its edge role (ADR 0040): one key in one
//! location (named `edge:<key id>:<colo>.<shard>` by `src/edge.rs`), where
//! Cloudflare creates it because that is where it was first asked for.
//!
//! It keeps the core's [`EdgeState`] in memory only — an eviction loses the
//! leases, whose units stay spent at the home until their window ends — and
//! does the I/O the core decides: a request is answered here, parked until
//! the answer to an ask in flight, or forwarded to the key's own object
//! (the home) with an ask; a prefetch goes to the home in the background.
//! Every answer of the home is applied, then every parked request decides
//! again. The home is called through `durable::client` like any caller; the
//! edge never calls anything else.

use std::cell::RefCell;
use std::rc::Rc;

use futures_channel::oneshot;
use postguard_core::guard::edge::{EdgeState, Step};
use postguard_core::guard::{
    AdmitResponse, EdgeAdmitReply, EdgeAdmitRequest, GuardError, Lease, LeaseReply, LeaseRequest,
    SlotAt,
};
use postguard_core::log::Line;
use worker::Env;

use super::sql::Sr;
use crate::durable::client::Guard;
use crate::log;
use crate::runtime::{now_ms, random_bytes, within};

/// The edge role's state, shared with the background asks it starts.
#[derive(Clone, Default)]
pub struct EdgeRole(Rc<Inner>);

#[derive(Default)]
struct Inner {
    state: RefCell<EdgeState>,
    /// Requests parked until the next answer is applied.
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// The home's stub, made once: every call to it goes through one stub,
    /// so the home receives them in the order they were sent.
    home: RefCell<Option<Guard>>,
}

/// Random bits for a new life of the edge (its asks must not repeat an
/// earlier life's); the clock if the runtime has no randomness to give.
fn seed() -> u64 {
    random_bytes::<8>().map_or_else(|_| now_ms(), u64::from_le_bytes)
}

impl EdgeRole {
    /// `EdgeAdmit`: the request answered from the leases, after a wait, or
    /// by the home (its answer's payload — a replay's body — passed on).
    /// A request waits for asks' answers a quarter of a lease at most in
    /// all (what an ask may take before it is given up): then the home
    /// decides it.
    pub async fn admit(&self, env: &Env, req: &EdgeAdmitRequest) -> Sr<(EdgeAdmitReply, Vec<u8>)> {
        let deadline = now_ms().saturating_add(req.settings.patience_ms());
        loop {
            let now = now_ms();
            let step = self.0.state.borrow_mut().step(req, seed, now);
            match step {
                Step::Answer { reply, prefetch } => {
                    if let Some(sent) = prefetch {
                        self.ask_in_background(env, &req.home, *sent);
                    }
                    return Ok((reply, Vec::new()));
                }
                Step::Wait { until } if now < deadline => {
                    self.wait(until.min(deadline).saturating_sub(now)).await
                }
                Step::Wait { .. } => break,
                Step::Forward(sent) => return self.forward(env, req, &sent).await,
            }
        }
        let sent = LeaseRequest {
            admit: req.admit.clone(),
            ask: None,
            settings: req.settings,
            request_ms: req.request_ms,
        };
        self.forward(env, req, &sent).await
    }

    /// `EdgeEnd`: a request on a slot leased to `life` has ended.
    pub fn end(&self, life: u64) {
        self.0.state.borrow_mut().end(life);
    }

    fn home(&self, env: &Env, name: &str) -> Sr<Guard> {
        if let Some(g) = self.0.home.borrow().as_ref() {
            return Ok(g.clone());
        }
        let g = Guard::of(env, name).map_err(|e| GuardError::Storage(e.to_string()))?;
        *self.0.home.borrow_mut() = Some(g.clone());
        Ok(g)
    }

    /// Sends `sent` to the home and applies its answer.
    async fn call_home(
        &self,
        env: &Env,
        home: &str,
        sent: &LeaseRequest,
    ) -> Sr<(LeaseReply, Vec<u8>)> {
        let guard = self.home(env, home)?;
        let answered = guard.call::<Lease>(sent, &[]).await;
        // Parked requests decide again when the answer changes what they
        // wait for: units granted, leases dropped, or an ask that failed
        // (given up: they forward themselves). Another request's answer
        // only lowers the home's figure, which cannot admit anyone.
        let changes = match &answered {
            Ok((reply, _)) => {
                self.0.state.borrow_mut().heard(reply, sent, now_ms());
                reply.grant.is_some()
                    || matches!(
                        reply.answer,
                        AdmitResponse::Revoked | AdmitResponse::Expired
                    )
            }
            Err(_) => true,
        };
        if changes {
            self.wake();
        }
        answered.map_err(|e| GuardError::Storage(format!("the key's object: {e}")))
    }

    /// The request decided by the home. A slot it asked for is held there.
    async fn forward(
        &self,
        env: &Env,
        req: &EdgeAdmitRequest,
        sent: &LeaseRequest,
    ) -> Sr<(EdgeAdmitReply, Vec<u8>)> {
        let (reply, payload) = self.call_home(env, &req.home, sent).await?;
        let slot = sent.admit.slot.as_ref().map(|_| SlotAt::Home);
        Ok((
            EdgeAdmitReply {
                answer: reply.answer,
                slot,
            },
            payload,
        ))
    }

    /// A prefetch or renewal: no request waits for it unless it is parked.
    fn ask_in_background(&self, env: &Env, home: &str, sent: LeaseRequest) {
        let (this, env, home) = (self.clone(), env.clone(), home.to_string());
        worker::wasm_bindgen_futures::spawn_local(async move {
            if let Err(e) = this.call_home(&env, &home, &sent).await {
                log::emit(Line::warn("an edge's ask to the key's object failed").err(e));
            }
        });
    }

    /// Parks the request until the next answer is applied, `ms` at most.
    async fn wait(&self, ms: u64) {
        let (tx, rx) = oneshot::channel();
        self.0.waiters.borrow_mut().push(tx);
        // Woken, timed out or dropped: the caller decides again either way.
        let _ = within(ms.max(1), rx).await;
    }

    fn wake(&self) {
        for waiter in self.0.waiters.borrow_mut().drain(..) {
            // A waiter whose wait ended has dropped its receiver.
            let _ = waiter.send(());
        }
    }
}
