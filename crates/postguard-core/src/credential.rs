//! What kind of credential a request's `Authorization` header carries. Each
//! endpoint family accepts one kind and answers 403 to a valid credential of
//! another kind; that rule is applied to this one classification.

use crate::ids;

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
    /// A token with the shape of an API key (the key itself).
    ApiKey(String),
    /// A token with the shape of a portal session (`pgs_…`, ADR 0010); its
    /// signature and expiry are checked by `portal::Signer::verify`.
    Session(String),
    /// Anything else: a wrong token.
    Other,
}

impl Credential {
    /// Classifies the `Authorization` header value against the two secrets.
    pub fn classify(authorization: Option<&str>, admin_token: &str, origin_token: &str) -> Self {
        let Some(token) = authorization.and_then(ids::bearer) else {
            return Credential::Missing;
        };
        if ids::secrets_equal(token, admin_token) {
            Credential::Operator
        } else if ids::secrets_equal(token, origin_token) {
            Credential::Origin
        } else if ids::is_well_formed_api_key(token) {
            Credential::ApiKey(token.to_string())
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
        Credential::classify(h, "admin-secret", "origin-secret")
    }

    #[test]
    fn classifies_each_kind() {
        let key = ids::new_api_key(&[3u8; 32]);
        assert_eq!(c(None), Credential::Missing);
        assert_eq!(c(Some("Basic x")), Credential::Missing);
        assert_eq!(c(Some("Bearer admin-secret")), Credential::Operator);
        assert_eq!(c(Some("bearer  origin-secret ")), Credential::Origin);
        assert_eq!(c(Some(&format!("Bearer {key}"))), Credential::ApiKey(key));
        assert_eq!(c(Some("Bearer pgk_short")), Credential::Other);
        assert_eq!(
            c(Some("Bearer pgs_x.y")),
            Credential::Session("pgs_x.y".into())
        );
        assert!(!c(Some("Bearer pgs_x.y")).is_secret());
        assert!(c(Some("Bearer admin-secret")).is_secret());
        assert!(!c(Some("Bearer nope")).is_secret());
    }
}
