//! [`GuardStore`] in memory: the host tests' backend of the key's object.

use std::collections::BTreeMap;

use super::{GuardStore, Part, Pending};
use crate::guard::{GuardState, Profile};
use crate::idempotency::Record;
use crate::limits::Windows;
use crate::operations::{self, Operation};
use crate::response_events::PendingEvent;

/// A [`GuardStore`] in memory, for tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemoryStore {
    pub state: GuardState,
    pub slots: BTreeMap<String, u64>,
    pub records: BTreeMap<String, Record>,
    pub bodies: BTreeMap<String, Vec<u8>>,
    pub operations: BTreeMap<String, Operation>,
    pub op_bodies: BTreeMap<(String, Part), Vec<u8>>,
    pub pending: BTreeMap<String, (Pending, u64)>,
}

impl GuardStore for MemoryStore {
    type Error = std::convert::Infallible;

    fn state(&mut self) -> Result<GuardState, Self::Error> {
        Ok(self.state.clone())
    }
    fn put_windows(&mut self, windows: &Windows) -> Result<(), Self::Error> {
        self.state.windows = windows.clone();
        Ok(())
    }
    fn put_revoked(&mut self, _at_ms: u64) -> Result<(), Self::Error> {
        self.state.revoked = true;
        Ok(())
    }
    fn put_profile(&mut self, profile: &Profile) -> Result<(), Self::Error> {
        self.state.profile = Some(profile.clone());
        Ok(())
    }
    fn put_ledger(&mut self, ledger: &crate::lease::Ledger) -> Result<(), Self::Error> {
        self.state.ledger = ledger.clone();
        Ok(())
    }
    fn slots_in_use(&mut self, now_ms: u64) -> Result<u32, Self::Error> {
        Ok(self.slots.values().filter(|until| **until > now_ms).count() as u32)
    }
    fn put_slot(&mut self, id: &str, until_ms: u64) -> Result<(), Self::Error> {
        self.slots.insert(id.to_string(), until_ms);
        Ok(())
    }
    fn delete_slot(&mut self, id: &str) -> Result<(), Self::Error> {
        self.slots.remove(id);
        Ok(())
    }
    fn delete_expired_slots(&mut self, now_ms: u64) -> Result<(), Self::Error> {
        self.slots.retain(|_, until| *until > now_ms);
        Ok(())
    }
    fn record(&mut self, key: &str) -> Result<Option<Record>, Self::Error> {
        Ok(self.records.get(key).cloned())
    }
    fn put_record(&mut self, key: &str, record: &Record) -> Result<(), Self::Error> {
        self.records.insert(key.to_string(), record.clone());
        Ok(())
    }
    fn delete_record(&mut self, key: &str) -> Result<(), Self::Error> {
        self.records.remove(key);
        Ok(())
    }
    fn body(&mut self, key: &str) -> Result<Vec<u8>, Self::Error> {
        Ok(self.bodies.get(key).cloned().unwrap_or_default())
    }
    fn put_body(&mut self, key: &str, body: &[u8]) -> Result<(), Self::Error> {
        self.bodies.insert(key.to_string(), body.to_vec());
        Ok(())
    }
    fn delete_body(&mut self, key: &str) -> Result<(), Self::Error> {
        self.bodies.remove(key);
        Ok(())
    }
    fn expired(&mut self, now_ms: u64, limit: usize) -> Result<Vec<String>, Self::Error> {
        let mut due: Vec<(u64, &String)> = self
            .records
            .iter()
            .map(|(k, r)| (r.expires_at_ms(), k))
            .filter(|(at, _)| *at <= now_ms)
            .collect();
        due.sort();
        Ok(due
            .into_iter()
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect())
    }
    fn next_expiry(&mut self) -> Result<Option<u64>, Self::Error> {
        Ok(self.records.values().map(Record::expires_at_ms).min())
    }
    fn operation(&mut self, id: &str) -> Result<Option<Operation>, Self::Error> {
        Ok(self.operations.get(id).cloned())
    }
    fn put_operation(&mut self, op: &Operation) -> Result<(), Self::Error> {
        self.operations.insert(op.id.clone(), op.clone());
        Ok(())
    }
    fn delete_operation(&mut self, id: &str) -> Result<(), Self::Error> {
        self.operations.remove(id);
        self.op_bodies.retain(|(k, _), _| k != id);
        Ok(())
    }
    fn op_body(&mut self, id: &str, part: Part) -> Result<Vec<u8>, Self::Error> {
        Ok(self
            .op_bodies
            .get(&(id.to_string(), part))
            .cloned()
            .unwrap_or_default())
    }
    fn put_op_body(&mut self, id: &str, part: Part, body: &[u8]) -> Result<(), Self::Error> {
        self.op_bodies.insert((id.to_string(), part), body.to_vec());
        Ok(())
    }
    fn operations(&mut self, page: &operations::Page) -> Result<Vec<Operation>, Self::Error> {
        let mut ops: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.project() == page.project)
            .filter(|op| page.state.is_none_or(|s| s == op.state))
            .filter(|op| {
                page.before
                    .as_ref()
                    .is_none_or(|(at, id)| (op.created_at, &op.id) < (*at, id))
            })
            .cloned()
            .collect();
        ops.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        ops.truncate(page.limit as usize);
        Ok(ops)
    }
    fn due_operations(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Operation>, Self::Error> {
        let mut due: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.due_at.is_some_and(|at| at <= now_ms))
            .cloned()
            .collect();
        due.sort_by_key(|op| op.due_at);
        due.truncate(limit);
        Ok(due)
    }
    fn expired_operations(
        &mut self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<Operation>, Self::Error> {
        let mut due: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.expires_at <= now_ms)
            .cloned()
            .collect();
        due.sort_by_key(|op| op.expires_at);
        due.truncate(limit);
        Ok(due)
    }
    fn next_operation_expiry(&mut self) -> Result<Option<u64>, Self::Error> {
        Ok(self.operations.values().map(|op| op.expires_at).min())
    }
    fn put_pending(&mut self, ev: &PendingEvent, now_ms: u64) -> Result<(), Self::Error> {
        self.pending.entry(ev.id.clone()).or_insert((
            Pending {
                event: ev.clone(),
                attempts: 0,
                first_at: now_ms,
            },
            now_ms,
        ));
        Ok(())
    }
    fn pending(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Pending>, Self::Error> {
        let mut due: Vec<&(Pending, u64)> = self
            .pending
            .values()
            .filter(|(_, at)| *at <= now_ms)
            .collect();
        due.sort_by_key(|(_, at)| *at);
        Ok(due
            .into_iter()
            .take(limit)
            .map(|(p, _)| p.clone())
            .collect())
    }
    fn retry_pending(&mut self, id: &str, attempts: u32, next_at: u64) -> Result<(), Self::Error> {
        if let Some((p, at)) = self.pending.get_mut(id) {
            p.attempts = attempts;
            *at = next_at;
        }
        Ok(())
    }
    fn delete_pending(&mut self, id: &str) -> Result<(), Self::Error> {
        self.pending.remove(id);
        Ok(())
    }
    fn next_work(&mut self) -> Result<Option<u64>, Self::Error> {
        let ops = self.operations.values().filter_map(|op| op.due_at);
        let events = self.pending.values().map(|(_, at)| *at);
        Ok(ops.chain(events).min())
    }
}
