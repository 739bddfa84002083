//! Workload identities: a pod's service account as a SPIFFE ID,
//! `spiffe://<trust domain>/ns/<namespace>/sa/<account>` (Istio's form, so its policies and
//! peers read ours). Parsing is strict: exactly those segments, Kubernetes' name rules, and a
//! trust domain of lower-case letters, digits, `.`, `-` and `_`.

use std::fmt;
use std::str::FromStr;

/// A workload identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    account: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("'{0}' is not spiffe://<trust domain>/ns/<namespace>/sa/<service account>")]
    Form(String),
    #[error("trust domain '{0}': lower-case letters, digits, '.', '-' and '_' only, 1 to 255 of them")]
    TrustDomain(String),
    #[error("{what} '{name}' is not a Kubernetes name (lower-case letters, digits, '-' and '.', at most {max})")]
    Name { what: &'static str, name: String, max: usize },
}

fn trust_domain_ok(td: &str) -> bool {
    !td.is_empty() && td.len() <= 255 && td.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// A DNS-1123 subdomain (service accounts) or label (namespaces, `max` 63).
fn k8s_name_ok(s: &str, max: usize, dots: bool) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| alnum(b) || b == b'-' || (dots && b == b'.')) && alnum(s.as_bytes()[0]) && alnum(s.as_bytes()[s.len() - 1])
}

impl SpiffeId {
    pub fn new(trust_domain: &str, namespace: &str, account: &str) -> Result<SpiffeId, IdError> {
        if !trust_domain_ok(trust_domain) {
            return Err(IdError::TrustDomain(trust_domain.into()));
        }
        if !k8s_name_ok(namespace, 63, false) {
            return Err(IdError::Name { what: "namespace", name: namespace.into(), max: 63 });
        }
        if !k8s_name_ok(account, 253, true) {
            return Err(IdError::Name { what: "service account", name: account.into(), max: 253 });
        }
        Ok(SpiffeId { trust_domain: trust_domain.into(), namespace: namespace.into(), account: account.into() })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn account(&self) -> &str {
        &self.account
    }

    /// The form Istio's AuthorizationPolicy writes principals in: without `spiffe://`.
    pub fn principal(&self) -> String {
        format!("{}/ns/{}/sa/{}", self.trust_domain, self.namespace, self.account)
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}", self.principal())
    }
}

impl FromStr for SpiffeId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<SpiffeId, IdError> {
        let form = || IdError::Form(s.chars().take(300).collect());
        let rest = s.strip_prefix("spiffe://").ok_or_else(form)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts[..] {
            [td, "ns", ns, "sa", sa] => SpiffeId::new(td, ns, sa),
            _ => Err(form()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_bad_ones_say_why() {
        let id: SpiffeId = "spiffe://cluster.local/ns/shop/sa/cart-v2.api".parse().unwrap();
        assert_eq!((id.trust_domain(), id.namespace(), id.account()), ("cluster.local", "shop", "cart-v2.api"));
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/cart-v2.api");
        assert_eq!(id.principal(), "cluster.local/ns/shop/sa/cart-v2.api");
        for bad in [
            "",
            "spiffe://",
            "http://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa/b/c",
            "spiffe://cluster.local/ns/a",
            "spiffe://cluster.local/sa/b/ns/a",
            "spiffe://Cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/A/sa/b",
            "spiffe://cluster.local/ns/a.b/sa/b",
            "spiffe://cluster.local/ns/-a/sa/b",
            "spiffe://cluster.local/ns/a/sa/",
            "spiffe:///ns/a/sa/b",
        ] {
            assert!(bad.parse::<SpiffeId>().is_err(), "{bad}");
        }
        let long = format!("spiffe://td/ns/{}/sa/b", "a".repeat(64));
        assert!(long.parse::<SpiffeId>().unwrap_err().to_string().contains("at most 63"));
    }
}
