//! The mesh's node proxy: workload identities ([`identity`]), the certificate authority and
//! workload certificates ([`ca`]), authorization by identity ([`authz`]) and the tunnels between
//! nodes' proxies ([`hbone`]). docs/mesh.md describes the whole.

pub mod authz;
pub mod ca;
pub mod hbone;
pub mod identity;
pub mod run;
