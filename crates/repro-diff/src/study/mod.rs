//! What multi-run studies compute from finished runs, with no model code: the statistics over
//! runs ([`stats`]) and the reports they fill ([`results`]). The runners that train the runs live
//! in the `repro` crate.

pub mod results;
pub mod stats;
