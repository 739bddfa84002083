//! The Gateway API: GatewayClasses of this controller, their Gateways, HTTPRoutes and
//! GRPCRoutes → `vectorlb proxy`'s configuration (pushed through its `PUT /v1/config`), the
//! Gateways' addresses through the L4 tier, and the conditions the specification asks for.

pub mod run;
pub mod translate;
pub mod types;
