//! The CNI plugin's parsing of what the runtime gives it (the network configuration, the
//! environment, the memif annotation) and the results it prints, apart from the binary so
//! that they can be tested and fuzzed without a runtime or a daemon.

pub mod spec;
