//! What kind of credential a request's `Authorization` header carries. Each
//! endpoint family accepts one kind and answers 403 to a valid credential of
//! another kind; that rule is applied to this one classification.

use crate::ids;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The SHA-256 digests of the two deployment secrets (`ADMIN_TOKEN`,
/// `ORIGIN_TOKEN`), computed once per configuration: a request then hashes
/// only its own token. Comparing digests in constant time leaks neither the
/// content nor the length of a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets {
    admin: [u8; 32],
    origin: [u8; 32],
}

impl Secrets {
    pub fn of(admin_token: &str, origin_token: &str) -> Self {
        Secrets {
            admin: Sha256::digest(admin_token.as_bytes()).into(),
            origin: Sha256::digest(origin_token.as_bytes()).into(),
        }
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets(..)")
    }
}

/// The bearer token of a request, classified. Secrets are compared in
/// constant time; an API key is only recognised by its shape here (whether it
/// exists is a lookup the shell makes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// The operator's `ADMIN_TOKEN`.
    Operator,
    /// The origin's `ORIGIN_TOKEN`.
    Origin,
    /// A token with the shape of an API key, as its lower-case hex SHA-256:
    /// the only form a key is looked up by (the key itself is not kept).
    ApiKey(String),
    /// A token with the shape of a portal session (`pgs_…`, ADR 0010); its
    /// signature and expiry are checked by `portal::Signer::verify`.
    Session(String),
    /// Anything else: a wrong token.
    Other,
}

impl Credential {
    /// Classifies the `Authorization` header value against the two secrets
    /// (their digests): the token is hashed once.
    pub fn classify(authorization: Option<&str>, secrets: &Secrets) -> Self {
        let Some(token) = authorization.and_then(ids::bearer) else {
            return Credential::Missing;
        };
        let given = Sha256::digest(token.as_bytes());
        if bool::from(given.as_slice().ct_eq(&secrets.admin)) {
            Credential::Operator
        } else if bool::from(given.as_slice().ct_eq(&secrets.origin)) {
            Credential::Origin
        } else if ids::is_well_formed_api_key(token) {
            Credential::ApiKey(format!("{given:x}"))
        } else if token.starts_with(crate::portal::Kind::Session.prefix()) {
            Credential::Session(token.to_string())
        } else {
            Credential::Other
        }
    }

    /// Whether it is one of the two deployment secrets (not an API key).
    pub fn is_secret(&self) -> bool {
        matches!(self, Credential::Operator | Credential::Origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(h: Option<&str>) -> Credential {
        Credential::classify(h, &Secrets::of("admin-secret", "origin-secret"))
    }

    #[test]
    fn classifies_each_kind() {
        let key = ids::new_api_key(&[3u8; 32]);
        assert_eq!(c(None), Credential::Missing);
        assert_eq!(c(Some("Basic x")), Credential::Missing);
        assert_eq!(c(Some("Bearer admin-secret")), Credential::Operator);
        assert_eq!(c(Some("bearer  origin-secret ")), Credential::Origin);
        assert_eq!(
            c(Some(&format!("Bearer {key}"))),
            Credential::ApiKey(ids::sha256_hex(&key))
        );
        assert_eq!(c(Some("Bearer pgk_short")), Credential::Other);
        assert_eq!(
            c(Some("Bearer pgs_x.y")),
            Credential::Session("pgs_x.y".into())
        );
        assert!(!c(Some("Bearer pgs_x.y")).is_secret());
        assert!(c(Some("Bearer admin-secret")).is_secret());
        assert!(!c(Some("Bearer nope")).is_secret());
        assert_eq!(c(Some("Bearer admin-secre")), Credential::Other);
        assert_eq!(c(Some("Bearer admin-secret2")), Credential::Other);
        assert_eq!(format!("{:?}", Secrets::of("a", "b")), "Secrets(..)");
    }
}
