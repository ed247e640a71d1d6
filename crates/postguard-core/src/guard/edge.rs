//! An edge object's decisions (ADR 0040): a key's requests in one location,
//! admitted from the blocks its home leased ([`lease::Edge`]), or forwarded
//! to the home with an ask. Pure: the object (`src/durable/key_guard/edge.rs`)
//! keeps an [`EdgeState`] in memory, runs [`EdgeState::step`] for each
//! request and applies each answer of the home with [`EdgeState::heard`].
//!
//! What the lease rules leave to this layer:
//! - the key's expiry and a reroll's old secrets are decided here as the
//!   home decides them (the caller's record, and the key's profile as the
//!   home last sent it), so an edge never admits an expired secret;
//! - requests with an Idempotency-Key (a claim, a lookup, an operation) go
//!   to the home, which charges and claims in one call as before;
//! - report-only limits (`Limits::report_only`): what the leases would
//!   refuse is admitted and named (`would_refuse`), as the home does; one
//!   that also needs a concurrency slot goes to the home;
//! - when to ask at all: a location holding no live lease asks once it has
//!   sent `min_block` requests (one that sends fewer is served by the home,
//!   and strands nothing); an edge whose every lease says the home had too
//!   little left to lease a block prefetches nothing more within that
//!   window (the figure only falls), but its forwards still carry an ask:
//!   one call in flight that its other requests wait for, never a flood.

use crate::lease::{Ask, Edge, EdgeDecision, EdgeLimits};
use crate::limits::{Limits, Verdicts};

use super::{
    expired_for, fresher, limits_of, AdmitRequest, AdmitResponse, EdgeAdmitReply, EdgeAdmitRequest,
    LeaseReply, LeaseRequest, Profile, Scope, SlotAt,
};

/// What an edge object keeps in memory (lost on eviction: the units its
/// leases held stay spent at the home until their window ends).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeState {
    pub edge: Option<Edge>,
    /// The key's profile as the home last sent it.
    pub profile: Option<Profile>,
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Answer it; then send `prefetch` to the home in the background.
    Answer {
        reply: EdgeAdmitReply,
        prefetch: Option<Box<LeaseRequest>>,
    },
    /// An ask in flight may cover it: decide again once an answer is
    /// applied, or at `until` (edge clock) at the latest.
    Wait { until: u64 },
    /// Send it to the home (with the edge's ask, if any).
    Forward(LeaseRequest),
}

impl EdgeState {
    /// Decides `req` at `now`. `seed` gives random bits for a new life of
    /// the edge (its first request, or after an eviction).
    pub fn step(&mut self, req: &EdgeAdmitRequest, seed: impl FnOnce() -> u64, now: u64) -> Step {
        let admit = &req.admit;
        if expired_for(self.profile.as_ref(), admit, now) {
            return answer(AdmitResponse::Expired, None);
        }
        let newer = fresher(self.profile.as_ref(), admit).cloned().map(Box::new);
        let limits = limits_of(newer.as_deref(), admit);
        let edge = self
            .edge
            .get_or_insert_with(|| Edge::new(&req.edge, seed(), now));
        let claims = admit.claim.is_some() || admit.lookup.is_some() || admit.operation.is_some();
        // Not the leases' to decide, and no demand for them: no ask rides along.
        if claims || admit.scope != Scope::Api {
            return Step::Forward(lease_request(req, admit.clone(), None));
        }
        let slot = admit.slot.is_some() && limits.concurrency.is_some();
        let admitted = |verdicts: Verdicts, would_refuse| AdmitResponse::Admitted {
            verdict: verdicts.binding_verdict(),
            idempotency: None,
            replay: None,
            verdicts: Some(verdicts),
            refresh: newer.clone(),
            lookup: None,
            operation: None,
            would_refuse,
        };
        let reply = match edge.admit(&limits, admit.cost, slot, now) {
            EdgeDecision::Admit { verdicts, slot } => EdgeAdmitReply {
                answer: admitted(verdicts, None),
                slot: slot.map(|life| SlotAt::Edge { life }),
            },
            // Report-only: admitted all the same, nothing taken from a lease.
            EdgeDecision::Refuse { verdicts } if limits.report_only && !slot => {
                let would = verdicts.violated().into_iter().next();
                EdgeAdmitReply {
                    answer: admitted(verdicts, would),
                    slot: None,
                }
            }
            EdgeDecision::Refuse { .. } if limits.report_only => {
                return forward(edge, req, &limits, now)
            }
            EdgeDecision::Refuse { verdicts } => EdgeAdmitReply {
                answer: AdmitResponse::Limited {
                    verdict: verdicts.binding_verdict(),
                    verdicts: Some(verdicts),
                },
                slot: None,
            },
            EdgeDecision::Wait => return wait(edge, now),
            EdgeDecision::Forward => return forward(edge, req, &limits, now),
        };
        let prefetch = prefetch(edge, req, &limits, now).map(Box::new);
        Step::Answer { reply, prefetch }
    }

    /// Applies the home's answer to a request or an ask (`sent`) made at
    /// some earlier instant. A revoked or expired key: every lease is
    /// dropped (nothing more is admitted here, the home answers each
    /// request). A grant is applied if it answers an ask this life
    /// remembers; the admission's verdicts lower what the edge believes the
    /// home has left.
    pub fn heard(&mut self, reply: &LeaseReply, sent: &LeaseRequest, now: u64) {
        if let Some(p) = &reply.profile {
            if self.profile.as_ref().is_none_or(|k| k.version < p.version) {
                self.profile = Some((**p).clone());
            }
        }
        let limits = limits_of(fresher(self.profile.as_ref(), &sent.admit), &sent.admit);
        let Some(edge) = self.edge.as_mut() else {
            return;
        };
        if matches!(
            reply.answer,
            AdmitResponse::Revoked | AdmitResponse::Expired
        ) {
            edge.forget();
            return;
        }
        if let Some(g) = &reply.grant {
            edge.apply(g, now);
        }
        // With an ask still in flight the home may have granted it before
        // this answer was decided: its figure would not count those units,
        // and a refusal on it would strand them. The ask's own answer brings
        // a figure soon enough.
        if asking(edge, now) {
            return;
        }
        for said in reply.answer.verdicts().map(|v| v.said).unwrap_or_default() {
            let Some(p) = limits.policies.iter().find(|p| p.name == said.name) else {
                continue;
            };
            let start = said.verdict.reset_ms.saturating_sub(p.window_ms);
            edge.heard(&said.name, start, said.verdict.remaining);
        }
    }

    /// A request that took a slot leased to `life` has ended.
    pub fn end(&mut self, life: u64) {
        if let Some(edge) = self.edge.as_mut() {
            edge.end_request(life);
        }
    }
}

/// Whether an ask is in flight and not given up.
fn asking(edge: &Edge, now: u64) -> bool {
    edge.pending.iter().any(|p| now < p.give_up_at)
}

/// Waits for the first answer, or until the earliest ask in flight is given up.
fn wait(edge: &Edge, now: u64) -> Step {
    let until = (edge.pending.iter())
        .map(|p| p.give_up_at)
        .filter(|at| *at > now)
        .min();
    Step::Wait {
        until: until.unwrap_or(now),
    }
}

fn answer(answer: AdmitResponse, slot: Option<SlotAt>) -> Step {
    Step::Answer {
        reply: EdgeAdmitReply { answer, slot },
        prefetch: None,
    }
}

/// The request to the home, with an ask unless the location is cold and
/// quiet. A warm edge's forward always carries one, even when it can bring
/// no units: it is the one call in flight the edge's other uncovered
/// requests wait for (its answer may make their refusal local), so a hot
/// location sends the home one call per round trip in a window's tail,
/// not one per request.
fn forward(edge: &mut Edge, req: &EdgeAdmitRequest, limits: &Limits, now: u64) -> Step {
    let s = &req.settings;
    let ask = match is_cold(edge, now) && edge.demand < s.min_block {
        true => None,
        false => edge.ask(limits, s, now),
    };
    Step::Forward(lease_request(req, req.admit.clone(), ask))
}

/// Whether the edge holds no live lease.
fn is_cold(edge: &Edge, now: u64) -> bool {
    !edge.pots.iter().any(|x| x.live(now))
}

/// A background ask (prefetch or renewal), as a cost-0 peek of the key.
fn prefetch(
    edge: &mut Edge,
    req: &EdgeAdmitRequest,
    limits: &Limits,
    now: u64,
) -> Option<LeaseRequest> {
    let s = &req.settings;
    if !(worth_asking(edge, s, now) || keeps_something(edge, now)) {
        return None;
    }
    let ask = edge.should_prefetch(limits, s, now)?;
    // Where notices go: the grant charges the home's windows, and a
    // threshold it crosses is noticed there (`store::lease`).
    let peek = AdmitRequest {
        caller: req.admit.caller.clone(),
        notices: req.admit.notices.clone(),
        ..AdmitRequest::charge(0, req.admit.requested_limits())
    };
    Some(lease_request(req, peek, Some(ask)))
}

fn lease_request(req: &EdgeAdmitRequest, admit: AdmitRequest, ask: Option<Ask>) -> LeaseRequest {
    LeaseRequest {
        admit,
        ask,
        settings: req.settings,
        request_ms: req.request_ms,
    }
}

/// Whether a background ask may bring units: a location holding no live
/// lease once it has shown `min_block` of demand; one holding live leases
/// while some of them says the home had at least two blocks' worth left
/// (the home leases nothing below half a fair share of `min_block`).
fn worth_asking(edge: &Edge, s: &EdgeLimits, now: u64) -> bool {
    if is_cold(edge, now) {
        return edge.demand >= s.min_block;
    }
    edge.pots
        .iter()
        .any(|x| x.live(now) && x.home_left / 2 >= s.min_block)
}

/// Whether a renewal keeps something: units held, or a refusal that the
/// live lease makes local (the home had nothing left).
fn keeps_something(edge: &Edge, now: u64) -> bool {
    edge.pots
        .iter()
        .any(|x| x.live(now) && (x.left > 0 || x.home_left == 0))
}

#[cfg(test)]
mod tests;
