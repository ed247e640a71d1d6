//! [`Named`]: the entries of a section keyed by name (`plans`,
//! `idempotency.methods`). A leaf of `config/`, as `check.rs` is.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Entries by name (`plans`, `idempotency.methods`): a JSON object read like a
/// `BTreeMap<String, T>` (sorted by name, the last of a repeated name wins, the
/// same error texts), kept as a sorted list. Each `BTreeMap` type is its own
/// copy of the B-tree code in the wasm; these few entries need none (ADR 0026).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named<T>(Vec<(String, T)>);

impl<T> Default for Named<T> {
    fn default() -> Self {
        Named(Vec::new())
    }
}

impl<T> Named<T> {
    pub fn get(&self, name: &str) -> Option<&T> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Adds or replaces the entry `name`.
    pub fn insert(&mut self, name: String, value: T) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (name, value)),
        }
    }

    /// Names in ascending order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(name))
    }
}

impl<T> FromIterator<(String, T)> for Named<T> {
    fn from_iter<I: IntoIterator<Item = (String, T)>>(entries: I) -> Self {
        let mut out = Named(Vec::new());
        for (k, v) in entries {
            out.insert(k, v);
        }
        out
    }
}

impl<'a, T> IntoIterator for &'a Named<T> {
    type Item = (&'a String, &'a T);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (String, T)>, fn(&'a (String, T)) -> Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// Like `BTreeMap`'s `Index`: panics on a missing name (tests only use it).
impl<T> std::ops::Index<&str> for Named<T> {
    type Output = T;

    fn index(&self, name: &str) -> &T {
        let i = self.find(name).unwrap_or(usize::MAX);
        &self.0[i].1
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Entries<T> {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named<T>, A::Error> {
                let mut out = Named(Vec::new());
                while let Some((k, v)) = map.next_entry()? {
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Entries(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::env;
    use crate::config::Config;

    #[test]
    fn named_entries_read_like_a_sorted_map() {
        let text = r#"{"plans":{"zeta":{"requests_per_window":1},"alpha":{"requests_per_window":2},"zeta":{"requests_per_window":3}}}"#;
        let c = Config::load(&env(Some(text))).unwrap();
        let plans = &c.settings.plans;
        assert_eq!(plans.keys().collect::<Vec<_>>(), ["alpha", "zeta"]);
        // The last of a repeated name wins, as in a BTreeMap.
        assert_eq!(
            plans.get("zeta").map(|p| p.requests_per_window),
            Some(Some(3))
        );
        assert!(plans.get("beta").is_none() && !plans.contains_key("beta"));
        let wrong = Config::load(&env(Some(r#"{"plans":[]}"#))).unwrap_err();
        assert_eq!(wrong.field, "plans");
        assert!(wrong.reason.contains("expected a map"), "{}", wrong.reason);
    }
}
