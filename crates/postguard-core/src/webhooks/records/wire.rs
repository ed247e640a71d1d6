//! The state machine's values on the wire, for the shard's protocol.

use serde::{Deserialize, Serialize};

use super::super::delivery::{self, Attempted, Claim, Status};

// serde: they are decisions, not records).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimWire {
    pub expect_status: Status,
    pub expect_attempts: u32,
    pub number: u32,
    pub mode: ModeWire,
    pub planned_next: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeWire {
    Schedule,
    Final,
    Redirect,
}

impl From<Claim> for ClaimWire {
    fn from(c: Claim) -> Self {
        ClaimWire {
            expect_status: c.expect.status,
            expect_attempts: c.expect.attempts_made,
            number: c.attempt.number,
            mode: match c.attempt.mode {
                delivery::Mode::Schedule => ModeWire::Schedule,
                delivery::Mode::Final => ModeWire::Final,
                delivery::Mode::Redirect => ModeWire::Redirect,
            },
            planned_next: c.attempt.planned_next,
        }
    }
}

impl From<ClaimWire> for Claim {
    fn from(c: ClaimWire) -> Self {
        Claim {
            expect: delivery::Expect {
                status: c.expect_status,
                attempts_made: c.expect_attempts,
            },
            attempt: delivery::Attempt {
                number: c.number,
                mode: match c.mode {
                    ModeWire::Schedule => delivery::Mode::Schedule,
                    ModeWire::Final => delivery::Mode::Final,
                    ModeWire::Redirect => delivery::Mode::Redirect,
                },
                planned_next: c.planned_next,
            },
            // Settling needs no lease: the attempt's write ends it.
            in_flight_until: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GiveUpWire {
    SubscriptionDeleted,
    GatewayFailure,
}

impl From<delivery::GiveUp> for GiveUpWire {
    fn from(g: delivery::GiveUp) -> Self {
        match g {
            delivery::GiveUp::SubscriptionDeleted => GiveUpWire::SubscriptionDeleted,
            delivery::GiveUp::GatewayFailure => GiveUpWire::GatewayFailure,
        }
    }
}

impl From<GiveUpWire> for delivery::GiveUp {
    fn from(g: GiveUpWire) -> Self {
        match g {
            GiveUpWire::SubscriptionDeleted => delivery::GiveUp::SubscriptionDeleted,
            GiveUpWire::GatewayFailure => delivery::GiveUp::GatewayFailure,
        }
    }
}

/// [`Attempted`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "attempted", rename_all = "snake_case")]
pub enum AttemptedWire {
    Status {
        code: u16,
        retry_after: Option<String>,
    },
    Timeout,
    NetworkError,
    GaveUp {
        why: GiveUpWire,
    },
}

impl From<Attempted> for AttemptedWire {
    fn from(a: Attempted) -> Self {
        use crate::webhooks::retry::AttemptResult as R;
        match a {
            Attempted::Sent(R::Status { code, retry_after }) => {
                AttemptedWire::Status { code, retry_after }
            }
            Attempted::Sent(R::Timeout) => AttemptedWire::Timeout,
            Attempted::Sent(R::NetworkError) => AttemptedWire::NetworkError,
            Attempted::GaveUp(g) => AttemptedWire::GaveUp { why: g.into() },
        }
    }
}

impl From<AttemptedWire> for Attempted {
    fn from(a: AttemptedWire) -> Self {
        use crate::webhooks::retry::AttemptResult as R;
        match a {
            AttemptedWire::Status { code, retry_after } => {
                Attempted::Sent(R::Status { code, retry_after })
            }
            AttemptedWire::Timeout => Attempted::Sent(R::Timeout),
            AttemptedWire::NetworkError => Attempted::Sent(R::NetworkError),
            AttemptedWire::GaveUp { why } => Attempted::GaveUp(why.into()),
        }
    }
}
