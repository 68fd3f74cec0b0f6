//! Measuring repro itself: what recording costs a training run (`overhead`), as reports for the
//! command line (`repro overhead`) or a library caller to show.

pub mod overhead;
