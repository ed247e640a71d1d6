//! What kind of credential a request carries. Each endpoint family accepts
//! one kind and answers 403 to a valid credential of another kind; that rule
//! is applied to this one classification. The operator's, the origin's and a
//! portal session's tokens are always `Authorization: Bearer`; an API key is
//! read from the sources `auth.api_key_from` names, in order (bearer, Basic
//! user name, a header), and may have any format (16–256 visible ASCII
//! characters): a key the API issued itself is an API key like postguard's.

use crate::ids;

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Where an API key may be presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `Authorization: Basic base64(<key>:<anything>)`.
    Basic,
    /// `<Name>: <key>` (its name as written; matched case-insensitively).
    Header(String),
}

/// How a client is told to send its key: each source, in order.
pub fn how_to_send(sources: &[KeySource]) -> String {
    let ways: Vec<String> = sources
        .iter()
        .map(|s| match s {
            KeySource::Bearer => "'Authorization: Bearer <key>'".to_string(),
            KeySource::Basic => "the user name of 'Authorization: Basic'".to_string(),
            KeySource::Header(n) => format!("'{n}: <key>'"),
        })
        .collect();
    format!("send the API key as {}", ways.join(" or "))
}

impl KeySource {
    /// `bearer`, `basic` or `header:<Name>` (a header field name, not one
    /// the gateway owns or forwards on its own terms).
    pub fn parse(s: &str) -> Result<KeySource, String> {
        match s {
            "bearer" => Ok(KeySource::Bearer),
            "basic" => Ok(KeySource::Basic),
            _ => {
                let name = s
                    .strip_prefix("header:")
                    .ok_or("must be \"bearer\", \"basic\" or \"header:<Name>\"")?;
                let token = !name.is_empty()
                    && name.len() <= 64
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                let reserved = ["authorization", "cookie", "idempotency-key", "host"]
                    .contains(&name.to_ascii_lowercase().as_str())
                    || name.to_ascii_lowercase().starts_with("x-postguard-");
                match (token, reserved) {
                    (false, _) => Err("header:<Name> needs a header name of 1-64 letters, digits, '-' or '_'".into()),
                    (_, true) => Err(format!("header:{name} is a header the gateway reads or sets itself: use \"bearer\" or \"basic\" for Authorization")),
                    _ => Ok(KeySource::Header(name.to_string())),
                }
            }
        }
    }
}

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
    /// A token that may be an API key, as its lower-case hex SHA-256: the
    /// only form a key is looked up by (the key itself is not kept).
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
        } else if token.starts_with(crate::portal::Kind::Session.prefix()) {
            Credential::Session(token.to_string())
        } else if ids::is_presentable_key(token) {
            Credential::ApiKey(format!("{given:x}"))
        } else {
            Credential::Other
        }
    }

    /// The credential of a request with these `headers`: the operator's or
    /// the origin's token, or a portal session, as `Authorization: Bearer`;
    /// otherwise the API key of the first of `sources` the request uses.
    pub fn of_request(
        headers: &[(String, String)],
        sources: &[KeySource],
        secrets: &Secrets,
    ) -> Self {
        let authorization = header(headers, "authorization");
        let bearer = Credential::classify(authorization, secrets);
        if !matches!(
            bearer,
            Credential::ApiKey(_) | Credential::Other | Credential::Missing
        ) {
            return bearer;
        }
        match presented_key(headers, sources) {
            Some(t) if ids::is_presentable_key(&t) => Credential::ApiKey(ids::sha256_hex(&t)),
            Some(_) => Credential::Other,
            None => Credential::Missing,
        }
    }

    /// Whether it is one of the two deployment secrets (not an API key).
    pub fn is_secret(&self) -> bool {
        matches!(self, Credential::Operator | Credential::Origin)
    }
}

/// The token in the first of `sources` the request uses, as given (to be
/// hashed, or sent once to the origin's key verification; never kept).
pub fn presented_key(headers: &[(String, String)], sources: &[KeySource]) -> Option<String> {
    let authorization = header(headers, "authorization");
    sources.iter().find_map(|source| match source {
        KeySource::Bearer => authorization.and_then(ids::bearer).map(str::to_string),
        KeySource::Basic => authorization.and_then(ids::basic_user),
        KeySource::Header(name) => header(headers, name)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string),
    })
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
        // A key of another format is a key (imported ones: issue 34).
        assert_eq!(
            c(Some("Bearer sk_live_0123456789abcdef")),
            Credential::ApiKey(ids::sha256_hex("sk_live_0123456789abcdef"))
        );
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

    #[test]
    fn an_api_key_is_read_from_the_sources_in_order() {
        use base64::Engine;
        let secrets = Secrets::of(
            "admin-secret-xxxxxxxxxxxxxxxxxxxxxx",
            "origin-secret-xxxxxxxxxxxxxxxxxxxxx",
        );
        let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let key = "sk_live_51Habcdefghijklmnop";
        let hashed = Credential::ApiKey(ids::sha256_hex(key));
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{key}:"))
        );
        let all = [
            KeySource::Header("X-Api-Key".into()),
            KeySource::Basic,
            KeySource::Bearer,
        ];
        let of =
            |hs: &[(String, String)], src: &[KeySource]| Credential::of_request(hs, src, &secrets);
        assert_eq!(of(&h(&[("x-api-key", key)]), &all), hashed);
        assert_eq!(of(&h(&[("Authorization", &basic)]), &all), hashed);
        assert_eq!(
            of(&h(&[("Authorization", &format!("Bearer {key}"))]), &all),
            hashed
        );
        // The first source the request uses wins.
        assert_eq!(
            of(
                &h(&[
                    ("x-api-key", "other-key-0123456789"),
                    ("Authorization", &basic)
                ]),
                &all
            ),
            Credential::ApiKey(ids::sha256_hex("other-key-0123456789"))
        );
        // A source not listed is not read.
        assert_eq!(
            of(&h(&[("x-api-key", key)]), &[KeySource::Bearer]),
            Credential::Missing
        );
        assert_eq!(
            of(&h(&[("Authorization", &basic)]), &[KeySource::Bearer]),
            Credential::Missing
        );
        // The deployment secrets and sessions stay Bearer, whatever the sources.
        assert_eq!(
            of(
                &h(&[(
                    "Authorization",
                    "Bearer admin-secret-xxxxxxxxxxxxxxxxxxxxxx"
                )]),
                &[KeySource::Header("X-Api-Key".into())]
            ),
            Credential::Operator
        );
        assert_eq!(of(&h(&[("x-api-key", "short")]), &all), Credential::Other);
        assert_eq!(of(&h(&[]), &all), Credential::Missing);
    }
}
