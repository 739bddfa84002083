//! The `vectorlb` binary's own part: the ipvsadm-like CLI (`ctl`) and the NIC-side queue-set
//! setup (`adq`). The daemon is
//! `vectorlb-daemon`, the control API `vectorlb-api`; this crate is the thin glue.

pub mod adq;
pub mod ctl;
