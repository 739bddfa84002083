//! The reasons the controller writes into Events and conditions: one closed set, so a new
//! reason is a new variant here (and in docs/kubernetes.md), never a string that falls through.

use std::fmt;

macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// An Event's or a condition's `reason` (Kubernetes' UpperCamelCase).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Reason {
            $($(#[$doc])* $name,)*
        }

        impl Reason {
            /// Every reason, for the documentation's test.
            pub const ALL: &'static [Reason] = &[$(Reason::$name,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)*
                }
            }
        }
    };
}

reasons! {
    /// An annotation's value is not one the controller takes; its default is used.
    InvalidAnnotation,
    /// A mode that needs the daemon's local addresses and a daemon without them.
    NoLocalAddress,
    /// A port of a protocol other than TCP and UDP.
    UnsupportedProtocol,
    /// An endpoint address that is not one.
    InvalidEndpoint,
    /// A port without a serving endpoint.
    NoEndpoints,
    /// A daemon refused the Service.
    ProgramFailed,
    /// Another Service has the same protocol, address and port.
    PortClash,
    /// The requested address is in no pool that allows the Service.
    AddressNotInPool,
    /// The requested address is another Service's.
    AddressInUse,
    /// The annotated pool does not exist.
    NoSuchPool,
    /// The annotated pool is not valid.
    PoolNotValid,
    /// The annotated pool does not allow this Service.
    PoolNotAllowed,
    /// No valid pool allows this Service.
    NoPool,
    /// Every candidate pool is full.
    PoolExhausted,
    /// The requested address is not an IP address.
    InvalidAddress,
    /// An address was assigned (a Normal Event).
    AddressAssigned,
    /// A pool's condition: it is used.
    Valid,
    /// A pool's condition: its addresses are not ranges, or it has none.
    InvalidAddresses,
    /// A pool's condition: it overlaps an older pool and is not used.
    Overlap,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_documented() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kubernetes.md")).unwrap();
        for r in Reason::ALL {
            assert!(doc.contains(&format!("`{r}`")), "docs/kubernetes.md does not name the reason `{r}`");
        }
    }
}
