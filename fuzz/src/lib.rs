//! Helpers shared by the fuzz targets and `examples/seeds.rs` (not a fuzz target itself).

pub mod pipeline;
